"""A tensor-parallel worker (ranks 1..N-1): holds its shard of the model and of the KV cache and
runs every step rank 0 sends it. Rank 0 owns the scheduler and the sampler; workers only need
each step's token ids, positions and block tables, and send nothing back but their share of the
collectives inside the forward pass.

Run directly under torchrun for ranks on other machines:

    torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --master-addr HOST --master-port 29500 \\
        -m inferd serve --tensor-parallel-size 2       # rank 0 serves, the others work
"""

from __future__ import annotations

import logging
import os
import sys

import torch
import torch.distributed as dist

from inferd.config import EngineConfig

log = logging.getLogger(__name__)

# Messages (rank 0 → all): ("step", [SequenceStep]), ("clear", blocks), ("copy", copies),
# ("report",), ("stop",)


def broadcast(message, control) -> object:
    """Rank 0 sends `message`; the others pass None and receive it."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]


def rank_report(model: torch.nn.Module, runner) -> dict:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return {"rank": dist.get_rank(), "pid": os.getpid(), "weight_bytes": params + buffers,
            "kv_cache_bytes": runner.kv_cache_bytes()}  # fmt: skip


def gather_reports(report: dict, control) -> list[dict] | None:
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(report, out, dst=0, group=control)
    return out


def worker_main(rank: int, world_size: int, init_method: str, config: EngineConfig,
                device_name: str, timeout_s: float) -> None:  # fmt: skip
    from inferd.distributed.launch import join_group
    from inferd.engine.model_setup import load_rank_model
    from inferd.engine.runner import ModelRunner

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    device = torch.device(device_name)
    tp, control = join_group(rank, world_size, init_method, device, timeout_s)
    model, dtype, kv_dtype, backend = load_rank_model(config, device, tp)
    num_blocks = broadcast(None, control)  # rank 0 sizes the pool, the same on every rank
    runner = ModelRunner(model, num_blocks, config.block_size, kv_dtype, device, backend,
                         lazy_zero=True)  # fmt: skip
    while True:
        message = broadcast(None, control)
        kind = message[0]
        if kind == "step":
            runner.execute(message[1])
        elif kind == "clear":
            runner.clear_blocks(message[1])
        elif kind == "copy":
            runner.copy_blocks(message[1])
        elif kind == "report":
            gather_reports(rank_report(model, runner), control)
        elif kind == "stop":
            break
    dist.destroy_process_group()


def torchrun_worker(config: EngineConfig) -> None:
    """Entry for ranks > 0 started by torchrun: serve rank 0 until it stops."""
    from inferd.distributed.launch import DEFAULT_TIMEOUT_S
    from inferd.platform import resolve_device

    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    worker_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", config,
                str(device), config.distributed_timeout or DEFAULT_TIMEOUT_S)  # fmt: skip
