"""Cache of the gguf mode's packed blocks, for a fast warm start (`--quantization gguf`).

Unpacking a GGUF file's blocks and laying them out for the C kernels (layers/gguf_blocks.py)
costs ~0.6 s of every start for the embedded model. After the first load, each block part and
the model's other tensors (norm gains, biases) are written once to a safetensors file under
`$INFERD_CACHE/weights/` (keyed and evicted like weight_cache.py's files); later starts map it
copy-on-write and rebuild the parts around the mapped tensors, with no unpacking.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import tempfile
from pathlib import Path

import torch

from inferd.layers.embedding import LMHead, VocabEmbedding
from inferd.layers.gguf_blocks import BlockPart, BlockWeight
from inferd.layers.linear import Linear
from inferd.loader import weight_cache

log = logging.getLogger(__name__)

VARIANT = "gguf-blocks-1"  # part of the cache key: change it when the layout changes
_DTYPES = {"U8": torch.uint8, "F16": torch.float16, "F32": torch.float32, "BF16": torch.bfloat16}


def _block_modules(model) -> dict[str, BlockWeight]:
    """module name → its BlockWeight (a tied LM head is the embedding's, stored once)."""
    out: dict[str, BlockWeight] = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear | LMHead) and isinstance(module.small_step, BlockWeight):
            if not any(module.small_step is seen for seen in out.values()):
                out[name] = module.small_step
        elif isinstance(module, VocabEmbedding) and module.blocks is not None:
            out[name] = module.blocks
    return out


def save(model, path: Path) -> None:
    from safetensors.torch import save_file

    tensors, layout = {}, []
    for name, weight in _block_modules(model).items():
        facts = []
        for i, part in enumerate(weight.parts):
            stored, part_facts = part.stored()
            tensors.update({f"{name}#{i}.{key}": t.contiguous() for key, t in stored.items()})
            facts.append(part_facts)
        layout.append({"module": name, "parts": facts})
    for name, param in model.named_parameters():
        if param.numel():
            tensors[f"param:{name}"] = param.detach().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        save_file(tensors, str(tmp_path), metadata={"layout": json.dumps(layout)})
        os.replace(tmp_path, path)
    except OSError as e:  # a full or read-only disk only costs start-up time
        log.warning("could not cache the gguf blocks at %s: %s", path, e)
        return
    weight_cache.evict_old(path.parent)


def load_into(model, path: Path) -> bool:
    """Fill a model prepared by `keep_gguf_blocks` from the cache. False if it does not fit
    (then nothing was changed)."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        (header_len,) = struct.unpack_from("<Q", mapped, 0)
        header = json.loads(mapped[8 : 8 + header_len])
        layout = json.loads(header.pop("__metadata__")["layout"])
    except (OSError, ValueError, KeyError):
        return False
    base = 8 + header_len

    def tensor(key: str) -> torch.Tensor:
        info = header[key]
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // torch.empty(0, dtype=dtype).element_size()
        return torch.frombuffer(mapped, dtype=dtype, count=count,
                                offset=base + start).view(info["shape"])  # fmt: skip

    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    dense = {k[len("param:") :]: k for k in header if k.startswith("param:")}
    try:
        for name, key in dense.items():
            if name not in params or list(params[name].shape) != header[key]["shape"]:
                return False
        covered = set(dense) | {f"{entry['module']}.weight" for entry in layout}
        if set(params) - covered:  # a tensor the cache does not hold: not this model's cache
            return False
        plan = []
        for entry in layout:
            module = modules.get(entry["module"])
            if not isinstance(module, Linear | LMHead | VocabEmbedding):
                return False
            parts = []
            for i, facts in enumerate(entry["parts"]):
                prefix = f"{entry['module']}#{i}."
                stored = {k[len(prefix) :]: tensor(k) for k in header if k.startswith(prefix)}
                parts.append(BlockPart.restored(stored, facts))
            plan.append((module, parts))
        dense_tensors = {name: tensor(key) for name, key in dense.items()}
    except (KeyError, ValueError, TypeError):
        return False
    for module, parts in plan:
        module.use_blocks(BlockWeight(parts=parts, compute_dtype=model.dtype))
    for name, t in dense_tensors.items():
        params[name].data = t
    model._gguf_cache_mmap = mapped  # the tensors point into it: keep it alive
    model.finalize()
    return True
