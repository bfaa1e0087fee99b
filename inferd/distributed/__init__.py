"""Multi-process execution: tensor parallelism over torch.distributed (see state.py)."""
