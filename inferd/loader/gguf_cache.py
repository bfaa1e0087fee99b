"""A GGUF file's packed blocks as a cache entry (mode `gguf-blocks`), for a fast warm start.

Unpacking a GGUF file's blocks and laying them out for the C kernels (layers/gguf_blocks.py)
costs ~0.6 s of every start for the embedded model. After the first load, the block parts of
every layer that keeps blocks are written once as a weight-cache entry (weight_cache.py: about
the file's own size); every start, the first included, then maps it copy-on-write and rebuilds
the parts around the mapped tensors, with no unpacking; a thread then moves the mapped bytes
into huge pages at the same addresses (huge_pages.py).
The entry holds blocks only: the few dense tensors (norm gains, biases, unquantised matrices)
are read from the GGUF file each time, so one entry serves every model dtype and every mode
that keeps blocks.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from inferd.distributed.state import TPGroup
from inferd.layers.block_method import BlockMethod
from inferd.layers.gguf_blocks import BlockPart, BlockWeight
from inferd.loader import huge_pages, weight_cache
from inferd.loader.checkpoint import Checkpoint
from inferd.progress import status

log = logging.getLogger(__name__)

MODE = "gguf-blocks-2"  # part of the cache key: change it when the layout changes
_DTYPES = {"U8": torch.uint8, "F16": torch.float16, "F32": torch.float32, "BF16": torch.bfloat16}


def _block_modules(model: torch.nn.Module) -> dict[str, BlockWeight]:
    """module name → its blocks (a tied LM head shares the embedding's method: stored once)."""
    out: dict[str, BlockWeight] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, BlockMethod) and method.blocks is not None and id(method) not in seen:
            seen.add(id(method))
            out[name] = method.blocks
    return out


def start_checking(source: Path, rank: int, world: int) -> None:
    """Start verifying the cache entry of GGUF file `source` for this rank now, in a thread
    (weight_cache.start_checking); `load_weights` then waits for the verdict. Nothing happens
    without an entry; starting twice is starting once."""
    if weight_cache.enabled():
        weight_cache.start_checking(weight_cache.entry_path(source, MODE, rank, world))


def stop_checking(source: Path, rank: int, world: int) -> None:
    """Drop a check `start_checking` began for a model that turned out not to keep blocks."""
    if weight_cache.enabled():
        weight_cache.stop_checking(weight_cache.entry_path(source, MODE, rank, world))


def load_weights(model, checkpoint: Checkpoint, tp: TPGroup) -> None:
    """Fill a model whose scheme keeps blocks: blocks from the cache entry when there is one
    that fits, the rest from the file; else everything from the file, then write the entry."""
    path = None
    if weight_cache.enabled():
        path = weight_cache.entry_path(checkpoint.path, MODE, tp.rank, tp.world_size)
    preloaded = _restore(model, path) if path is not None and path.exists() else None
    if preloaded is None:
        with torch.no_grad(), status(f"packing {checkpoint.path.name}'s quantised blocks"):
            model.load_weights(checkpoint.weights(), frozenset())
        if path is not None:
            with status("caching the packed blocks"):
                saved = _save(model, path, checkpoint, tp)
            if saved and _restore(model, path) is not None:
                _rebuild_decoder(model)  # the blocks now live in the entry, as on later starts
    else:
        with torch.no_grad():
            model.load_weights(checkpoint.weights(), preloaded)


def _rebuild_decoder(model) -> None:
    """The C decoder copies its layers' block pointers when the model is finalised: after the
    blocks moved, it is built again around the new ones (nothing else keeps such pointers)."""
    if getattr(model, "cpu_decoder", None) is not None:
        from inferd.models.cpu_decoder import CpuDecoder

        model.cpu_decoder = CpuDecoder.for_model(model)


def _save(model, path, checkpoint: Checkpoint, tp: TPGroup) -> bool:
    """Write the model's blocks as the entry at `path`; whether an entry was written."""
    tensors, layout = {}, []
    for name, weight in _block_modules(model).items():
        facts = []
        for i, part in enumerate(weight.parts):
            stored, part_facts = part.stored()
            tensors.update({f"{name}#{i}.{key}": t.contiguous() for key, t in stored.items()})
            facts.append(part_facts)
        layout.append({"module": name, "parts": facts})
    if not layout:
        return False  # nothing was block-quantised: nothing worth caching
    info = {"model": str(checkpoint.path), "name": checkpoint.config.name, "mode": MODE,
            "source_bytes": checkpoint.path.stat().st_size, "rank": tp.rank,
            "world": tp.world_size}  # fmt: skip
    return weight_cache.write_entry(path, tensors, {"layout": json.dumps(layout)}, info)


def _restore(model, path) -> frozenset[str] | None:
    """Install the cached blocks into the model's block methods; the names of the weights
    they replace, or None (nothing changed) when the entry does not fit this model."""
    entry = weight_cache.map_entry(path)
    if entry is None:
        return None
    mapped, header, base = entry

    def tensor(key: str) -> torch.Tensor:
        info = header[key]
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // torch.empty(0, dtype=dtype).element_size()
        return torch.frombuffer(mapped, dtype=dtype, count=count,
                                offset=base + start).view(info["shape"])  # fmt: skip

    modules = dict(model.named_modules())
    plan = []
    try:
        layout = json.loads(header["__metadata__"]["layout"])
        for entry_facts in layout:
            module = modules.get(entry_facts["module"])
            method = getattr(module, "quant_method", None)
            if not isinstance(method, BlockMethod):
                return None
            parts = []
            for i, facts in enumerate(entry_facts["parts"]):
                prefix = f"{entry_facts['module']}#{i}."
                stored = {k[len(prefix) :]: tensor(k) for k in header if k.startswith(prefix)}
                parts.append(BlockPart.restored(stored, facts))
            blocks = BlockWeight(parts=parts)
            # the dense matrix's shape, or, where blocks replaced it (a first load), theirs
            shape = module.weight.shape if method.blocks is None else method.blocks.shape
            if tuple(blocks.shape) != tuple(shape):
                return None
            plan.append((entry_facts["module"], module, method, blocks))
    except (KeyError, ValueError, TypeError):
        return None
    for _, module, method, blocks in plan:
        method.install(module, blocks)
    model._block_cache_mmap = mapped  # the blocks point into it: keep it alive
    huge_pages.start_moving(mapped, path.name)
    try:
        os.utime(path)  # recently used: eviction keeps it
    except OSError:
        pass
    return frozenset(f"{name}.weight" for name, *_ in plan)
