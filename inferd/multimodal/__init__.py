"""Images in: decoding and checking what a caller sends (image_decode.py), the model's own
preprocessing and the prompt's placeholder tokens (image_processor.py), and the plain record an
image travels to the engine core as (image_input.py). The encoder itself is the model's
(inferd/models/vision_encoder.py)."""
