"""Joining the process group of a tensor-parallel engine.

One machine: rank 0 (the engine's process) spawns ranks 1..N-1 as processes and all join a
process group over loopback. Several machines: every rank is started by `torchrun` (or anything
that sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK). Which process runs what (the engine on
rank 0, the worker loop on the others) is the engine's business: `inferd/engine/tp_workers.py`.

Collectives get a timeout (`distributed_timeout`, 60 s by default), so a rank that hangs or dies
makes the others fail instead of waiting forever.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from inferd.distributed.state import TPGroup

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_group(rank: int, world_size: int, init_method: str, device: torch.device,
               timeout_s: float) -> tuple[TPGroup, object]:  # fmt: skip
    """Join the process group; returns (the TP group, a gloo group for control messages)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    # Control messages are Python objects; gloo carries them whatever the device backend is.
    control = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
    return TPGroup(rank, world_size, dist.group.WORLD), control
