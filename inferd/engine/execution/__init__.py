"""Running a step on the device: the executor, the model runner (and its tensor-parallel and CUDA-
graph forms), the model's set-up."""
