"""The processes of a tensor-parallel engine: rank 0 starts the workers (ranks 1..N-1), each
holding its shard of the model and of the KV cache and running every step rank 0 sends it. Rank 0
owns the scheduler and the sampler; workers only need each step's token ids, positions and block
tables, and send nothing back but their share of the collectives inside the forward pass.
Rank 0's side of the conversation is `tp_runner.py`.

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
import torch.multiprocessing as mp

from inferd.config import EngineConfig
from inferd.distributed.control import broadcast, gather_reports
from inferd.distributed.launch import (
    DEFAULT_TIMEOUT_S,
    end_rendezvous,
    join_group,
    launched_by_torchrun,
    leave_group,
    local_rendezvous,
)
from inferd.distributed.state import TPGroup
from inferd.engine.execution.model_setup import load_rank_model
from inferd.engine.execution.runner import ModelRunner
from inferd.platform import resolve_device

log = logging.getLogger(__name__)

# Messages (rank 0 → all): ("step", StepRecord) (the engine's steps: the record's deltas keep
# each worker's copy of the sequences current, engine/execution/device_state.py), ("rows",
# [SequenceStep]) (rows given whole) and ("clear", blocks), for direct runner use; ("report",),
# ("stop",)


def start_ranks(config: EngineConfig, device: torch.device) -> tuple[TPGroup, object, list]:
    """Rank 0's side: spawn the other ranks here (or find them under torchrun) and join."""
    n = config.tensor_parallel_size
    timeout = config.distributed_timeout or DEFAULT_TIMEOUT_S
    if launched_by_torchrun():
        if int(os.environ["WORLD_SIZE"]) != n:
            raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but tensor_parallel_size={n}")
        tp, control = join_group(0, n, "env://", device, timeout)
        return tp, control, []
    init_method = local_rendezvous()  # a private file, no listening port (launch.py)
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, n):
        worker_device = device if device.type == "cpu" else torch.device("cuda", rank)
        args = (rank, n, init_method, config, str(worker_device), timeout)
        p = ctx.Process(target=worker_main, name=f"inferd-tp-rank{rank}", daemon=True, args=args)
        p.start()
        procs.append(p)
    log.info("started %d tensor-parallel worker processes", len(procs))
    try:
        tp, control = join_group(0, n, init_method, device, timeout)
    finally:
        end_rendezvous(init_method)
    return tp, control, procs


def rank_report(model: torch.nn.Module, runner) -> dict:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return {"rank": dist.get_rank(), "pid": os.getpid(), "weight_bytes": params + buffers,
            "kv_cache_bytes": runner.kv_cache_bytes()}  # fmt: skip


def worker_main(rank: int, world_size: int, init_method: str, config: EngineConfig,
                device_name: str, timeout_s: float) -> None:  # fmt: skip
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
            runner.execute_step(message[1])
        elif kind == "rows":
            runner.execute(message[1])
        elif kind == "clear":
            runner.clear_blocks(message[1])
        elif kind == "report":
            gather_reports(rank_report(model, runner), control)
        elif kind == "stop":
            break
    del control  # leave_group joins the group's threads once nothing refers to it
    leave_group(tp)


def torchrun_worker(config: EngineConfig) -> None:
    """Entry for ranks > 0 started by torchrun: serve rank 0 until it stops."""
    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    worker_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", config,
                str(device), config.distributed_timeout or DEFAULT_TIMEOUT_S)  # fmt: skip
