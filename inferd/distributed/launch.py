"""Joining the process group of a tensor-parallel engine.

One machine: rank 0 (the engine's process) spawns ranks 1..N-1 as processes and all join a
process group over loopback. They meet through a file in a new directory only this user can
open (`local_rendezvous`), not a TCP store: torch's TCP store listens on every interface and
lets anyone who connects read and write the rendezvous. Gloo's own connections are bound to the
loopback interface. Several machines: every rank is started by `torchrun` (or anything that
sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK), and the network is the user's choice.
Which process runs what (the engine on rank 0, the worker loop on the others) is the engine's
business: `inferd/engine/execution/tp_workers.py`.

Collectives get a timeout (`distributed_timeout`, 60 s by default), so a rank that hangs or dies
makes the others fail instead of waiting forever.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from inferd.distributed.state import TPGroup

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rendezvous() -> str:
    """An init_method for ranks on this machine: a file in a fresh directory that `mkdtemp`
    creates readable by this user only. Nothing listens on a port for it; `end_rendezvous`
    removes it once every rank has joined."""
    folder = tempfile.mkdtemp(prefix="inferd-tp-")
    return f"file://{folder}/rendezvous"


def end_rendezvous(init_method: str) -> None:
    if init_method.startswith("file://"):
        shutil.rmtree(Path(init_method[len("file://") :]).parent, ignore_errors=True)


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


@contextmanager
def _gloo_on_loopback(enabled: bool) -> Iterator[None]:
    """Gloo listens on the interface GLOO_SOCKET_IFNAME names (else the hostname's address,
    often a public one); it is read when a group is made, so it is set only meanwhile."""
    name = _loopback_interface() if enabled and "GLOO_SOCKET_IFNAME" not in os.environ else None
    if name is None:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_group(rank: int, world_size: int, init_method: str, device: torch.device,
               timeout_s: float) -> tuple[TPGroup, object]:  # fmt: skip
    """Join the process group; returns (the TP group, a gloo group for control messages). With
    a local rendezvous every rank has joined when this returns (so it can be removed)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    local = init_method.startswith("file://")
    with _gloo_on_loopback(local):
        dist.init_process_group(
            backend_for(device),
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        # Control messages are Python objects; gloo carries them whatever the device backend is.
        control = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
    if local:
        dist.barrier(group=control)  # every rank is past the rendezvous
    return TPGroup(rank, world_size, dist.group.WORLD), control


def leave_group(tp: TPGroup) -> None:
    """Leave the process group for good and let its threads end now. The caller drops its own
    references to the group first (the control group included).

    NOTE: `destroy_process_group` alone leaves gloo's threads running for as long as any object
    refers to the group. A collective's clean-up (freeing its tensors) takes Python's lock on
    one of those threads; when the last message before exit was still being cleaned up as the
    interpreter shut down, the thread could not get the lock and the process aborted at exit
    ("terminate called without an active exception"). With no reference left, the group's
    destructor joins its threads here, with Python's lock released."""
    if dist.is_initialized():
        dist.destroy_process_group()
    tp.group = None
