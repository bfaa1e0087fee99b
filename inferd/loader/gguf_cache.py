"""A GGUF file's packed blocks as a cache entry (mode `gguf-blocks`), for a fast warm start.

Unpacking a GGUF file's blocks and laying them out for the C kernels (layers/gguf_blocks.py)
costs seconds per GB of file. The first load writes the block parts of every layer that keeps
blocks to a weight-cache entry (weight_cache.py: about the file's own size) while it packs
them, a layer at a time, each dropped from memory once written (`_StreamedEntry`): a first load
holds the process, one tensor of the file being unpacked, and the layers not yet written, never
the file's pages and a packed copy and the entry at once. Every start, the first included,
then serves the blocks from the entry, mapped copy-on-write, the parts rebuilt around the
mapped tensors with no unpacking; a thread moves the mapped bytes into huge pages at the same
addresses (huge_pages.py). Where the entry cannot be written (the cache's size, a full or
read-only disk) the blocks are packed into memory at every start, and that is said once.
The entry holds blocks only: the few dense tensors (norm gains, biases, unquantised matrices)
are read from the GGUF file each time, so one entry serves every model dtype and every mode
that keeps blocks.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import torch

from inferd.distributed.state import TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.block_method import BlockMethod
from inferd.layers.gguf_blocks import CHUNK_WEIGHTS, BlockPart, BlockWeight
from inferd.loader import huge_pages, weight_cache
from inferd.loader.checkpoint import Checkpoint
from inferd.loader.gguf_quants import PACKED_BITS, type_name
from inferd.memory_trim import trim_now
from inferd.progress import status

log = logging.getLogger(__name__)

# What a first load holds unpacked at once beyond the packed blocks: one range of rows of a
# matrix (gguf_blocks.CHUNK_WEIGHTS weights), as q (a byte each) and the unpackers' byte- and
# 16-bit temporaries of the same shape.
UNPACKING_BYTES = 4 * CHUNK_WEIGHTS
MODE = "gguf-blocks-3"  # part of the cache key: change it when the layout changes
_DTYPES = {"U8": torch.uint8, "F16": torch.float16, "F32": torch.float32, "BF16": torch.bfloat16}


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


def load_weights(model, checkpoint: Checkpoint, tp: TPGroup, cache_bytes: int | None = None
                 ) -> None:  # fmt: skip
    """Fill a model whose scheme keeps blocks: blocks from the cache entry when there is one
    that fits, the rest from the file; else everything from the file, the entry written as
    the blocks are packed (`cache_bytes`: the cache's size, weight_cache.budget)."""
    path = None
    if weight_cache.enabled():
        path = weight_cache.entry_path(checkpoint.path, MODE, tp.rank, tp.world_size)
    shapes = _block_shapes(model)
    preloaded = _restore(model, path, shapes) if path is not None and path.exists() else None
    if preloaded is not None:
        with torch.no_grad():
            model.load_weights(checkpoint.weights(), preloaded)
        return
    entry = _StreamedEntry.start(model, checkpoint, tp, path, shapes, cache_bytes)
    try:
        with torch.no_grad(), status(f"packing {checkpoint.path.name}'s quantised blocks"):
            model.load_weights(_streamed(checkpoint.weights(), entry), frozenset())
    except BaseException:
        if entry is not None:
            entry.writer.abort()  # a tensor the model refused: no unfinished file left behind
        raise
    trim_now()  # the load's temporaries go back to the system


def _streamed(weights, entry: _StreamedEntry | None):
    """The checkpoint's weights, the entry written as each layer's blocks are packed.
    NOTE: the entry is finished, and its mapped blocks installed, when the model asks for the
    tensor after the last: before `load_weights` finalises the model (the C decoder takes the
    blocks' addresses then)."""
    for pair in weights:
        yield pair
        if entry is not None:
            entry.write_packed()
    if entry is not None:
        entry.finish()


def _block_shapes(model) -> dict[str, tuple[int, int]]:
    """Module name → (out, in) of every layer whose method keeps blocks, before loading drops
    their dense matrices (a tied LM head shares the embedding's method: counted once)."""
    out, seen = {}, set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, BlockMethod) and id(method) not in seen:
            seen.add(id(method))
            out[name] = tuple(module.weight.shape)
    return out


class _StreamedEntry:
    """The cache entry of a first load, written while the model loads: each layer's blocks
    go to the file as soon as they are packed and are dropped from memory, so that a first
    load holds about one layer besides what is already written (the packed copy of the
    whole model, in memory, is what made a first load need several times the file's size).
    At the end the entry is mapped and its blocks installed, as on a cached start. If writing
    fails (a disk that fills up meanwhile), what was written is mapped all the same from the
    unfinished file (deleted: its pages live as long as the mapping) and the rest is kept in
    memory: the model runs; the next start packs again."""

    def __init__(self, model, path: Path, writer: weight_cache.EntryWriter, info: dict,
                 shapes: dict, cache_bytes: int):  # fmt: skip
        self.model, self.path, self.writer, self.info = model, path, writer, info
        self.shapes, self.cache_bytes = shapes, cache_bytes
        self.layout: list[dict] = []
        self.failed = False

    @classmethod
    def start(cls, model, checkpoint: Checkpoint, tp: TPGroup, path: Path | None,
              shapes: dict, cache_bytes: int | None) -> _StreamedEntry | None:  # fmt: skip
        """None (said once, as a warning) when there is no room for the entry: the blocks then
        stay in memory, packed from the file."""
        if path is None or not shapes:
            return None
        cache_bytes = weight_cache.budget(cache_bytes)
        estimate = packed_bytes(checkpoint)
        try:
            why = weight_cache.room_for(estimate, path.parent, cache_bytes)
            if why is None:
                room = 4096 + 8192 * len(shapes)  # the header: names and layout facts
                writer = weight_cache.EntryWriter(path, room)
        except OSError as e:
            why = str(e)
        if why is not None:
            log.warning("not caching %s's packed blocks (%s): it runs from the file, packed "
                        "at every start", checkpoint.path.name, why)  # fmt: skip
            return None
        info = {"model": str(checkpoint.path), "name": checkpoint.config.name, "mode": MODE,
                "source_bytes": weight_cache.source_identity(checkpoint.path)[0],
                "rank": tp.rank,
                "world": tp.world_size}  # fmt: skip
        return cls(model, path, writer, info, shapes, cache_bytes)

    def write_packed(self) -> None:
        """Write the blocks of every layer packed since the last call, then drop them."""
        if self.failed:
            return
        for name, method, weight in _packed_layers(self.model):
            facts = []
            try:
                for i, part in enumerate(weight.parts):
                    stored, part_facts = part.stored()
                    for key, t in stored.items():
                        self.writer.write(f"{name}#{i}.{key}", t)
                    facts.append(part_facts)
            except OSError as e:
                log.warning("could not finish caching the packed blocks at %s (%s): the rest "
                            "stay in memory", self.path, e)  # fmt: skip
                self.failed = True
                return
            self.layout.append({"module": name, "parts": facts})
            method.blocks = None  # in the entry now; mapped back in at the end

    def finish(self) -> None:
        metadata = {"layout": json.dumps(self.layout)}
        if not self.failed:
            try:
                self.writer.commit(metadata, self.info, self.cache_bytes)
            except OSError as e:
                log.warning("could not cache the packed blocks at %s: %s", self.path, e)
                self.failed = True
        if not self.failed:
            entry = weight_cache.map_entry(self.path, written_now=True)
        else:  # the layers already written are read back from the unfinished file
            entry = weight_cache.map_unfinished(self.writer, metadata)
            self.writer.abort()
        if entry is None or not _install(self.model, *entry, self.shapes, self.path.name):
            raise ModelLoadError(f"the packed blocks written to {self.path} do not read back")


def _packed_layers(model):
    """(name, method, blocks) of each layer whose method holds packed blocks now."""
    seen = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, BlockMethod) and method.blocks is not None and id(method) not in seen:
            seen.add(id(method))
            yield name, method, method.blocks


def packed_bytes(checkpoint: Checkpoint) -> int:
    """About what the file's blocks take packed (gguf_quants.PACKED_BITS), for the room an
    entry needs; its dense tensors are not in the entry."""
    if checkpoint.gguf is None:  # a pre-quantised HF checkpoint (hf_quantized.py)
        from inferd.loader.hf_dir import hf_tensor_shapes
        from inferd.loader.hf_quantized import stored_weight_bytes

        return stored_weight_bytes(hf_tensor_shapes(checkpoint.path), checkpoint.quant, 0)
    total = 0.0
    for info in checkpoint.gguf.tensors.values():
        if is_packed(info):
            total += math.prod(info.shape) * PACKED_BITS[type_name(info.ggml_type)] / 8
    return int(total)


def is_packed(info) -> bool:
    """Whether a GGUF tensor (a GGUFTensorInfo) is held as packed blocks (a quantised matrix)."""
    return type_name(info.ggml_type) in PACKED_BITS and len(info.shape) >= 2


def _restore(model, path, shapes: dict) -> frozenset[str] | None:
    """Install the cached blocks into the model's block methods; the names of the weights
    they replace, or None (nothing changed) when the entry does not fit this model."""
    entry = weight_cache.map_entry(path)
    if entry is None:
        return None
    installed = _install(model, *entry, shapes, path.name)
    if installed is None:
        return None
    try:
        os.utime(path)  # recently used: eviction keeps it
    except OSError:
        pass
    return installed


def _install(model, mapped, header: dict, base: int, shapes: dict, what: str
             ) -> frozenset[str] | None:  # fmt: skip
    """Install the blocks of a mapped entry (`header`: its safetensors header, data from byte
    `base`) into the model's block methods, checking each against `shapes`; the names of the
    weights they replace, or None (nothing changed) when they do not fit this model."""

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
            name = entry_facts["module"]
            method = getattr(modules.get(name), "quant_method", None)
            if not isinstance(method, BlockMethod):
                return None
            parts = []
            for i, facts in enumerate(entry_facts["parts"]):
                prefix = f"{name}#{i}."
                stored = {k[len(prefix) :]: tensor(k) for k in header if k.startswith(prefix)}
                parts.append(BlockPart.restored(stored, facts))
            blocks = BlockWeight(parts=parts)
            if tuple(blocks.shape) != shapes.get(name):
                return None
            plan.append((name, modules[name], method, blocks))
    except (KeyError, ValueError, TypeError):
        return None
    for _, module, method, blocks in plan:
        method.install(module, blocks)
    # the blocks point into the mapping: keep it alive (a second one, after a failed write)
    model._block_cache_mmaps = [*getattr(model, "_block_cache_mmaps", []), mapped]
    huge_pages.start_moving(mapped, what)
    return frozenset(f"{name}.weight" for name, *_ in plan)
