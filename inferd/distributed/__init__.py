"""Tensor parallelism over torch.distributed: the rank's group and its collectives (state.py),
joining the process group (launch.py) and control messages between ranks (control.py). It knows
nothing of the engine; the engine's worker processes are inferd/engine/execution/tp_workers.py."""
