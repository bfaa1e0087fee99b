"""A pre-quantised HF checkpoint's tensors, grouped into one lazy weight per layer.

A quantised layer is stored as several tensors (AWQ/GPTQ: `qweight`, `qzeros`, `scales`,
`g_idx`; compressed-tensors: `weight`, `weight_scale`, `input_scale`, `weight_zero_point`);
the model loads one `<layer>.weight`. `grouped` yields that weight (hf_quant_weights.py reads
it as blocks) and passes every other tensor through; `logical_shapes` does the same over the
headers alone, so that the config is checked against the shapes the model will hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from inferd.errors import ModelLoadError
from inferd.loader.hf_quant_config import QuantFormat
from inferd.loader.hf_quant_weights import AwqWeight, Fp8StoredWeight, GptqWeight, Int8Weight

# Per format: the tensor that marks a quantised layer, and the others that belong to it.
_PARTS = {
    "awq": ("qweight", ("qzeros", "scales")),
    "gptq": ("qweight", ("qzeros", "scales", "g_idx")),
    "int8": ("weight_scale", ("weight", "weight_zero_point", "input_scale")),
    "fp8": ("weight_scale", ("weight", "input_scale", "weight_zero_point")),
}
_READERS = {"awq": AwqWeight, "gptq": GptqWeight, "int8": Int8Weight, "fp8": Fp8StoredWeight}


def _layers(names: Iterable[str], fmt: QuantFormat) -> dict[str, dict[str, str]]:
    """layer prefix → {part: tensor name} for every quantised layer."""
    marker, others = _PARTS[fmt.method]
    names = set(names)
    out = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        if leaf == marker:
            parts = {p: f"{prefix}.{p}" for p in (marker, *others) if f"{prefix}.{p}" in names}
            out[prefix] = parts
    return out


def grouped(weights: Iterable[tuple[str, Any]], fmt: QuantFormat) -> Iterator[tuple[str, Any]]:
    """(name, lazy weight) pairs with each quantised layer's tensors as one `<layer>.weight`."""
    if fmt.method not in _READERS:  # MXFP4: the family's own reader (hf_mxfp4.py)
        yield from weights
        return
    pairs = dict(weights)
    layers = _layers(pairs, fmt)
    taken = {t for parts in layers.values() for t in parts.values()}
    for prefix, parts in layers.items():
        tensors = {part: pairs[name] for part, name in parts.items()}
        try:
            yield f"{prefix}.weight", _READERS[fmt.method](tensors, fmt, prefix)
        except (KeyError, ValueError) as e:
            missing = f"lacks {e}" if isinstance(e, KeyError) else str(e)
            raise ModelLoadError(f"{fmt.name} layer {prefix}: {missing}") from e
    for name, weight in pairs.items():
        if name not in taken:
            yield name, weight


def logical_shapes(shapes: dict[str, tuple[int, ...]], fmt: QuantFormat
                   ) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """Header shapes → the shapes the model holds: a quantised layer's tensors become one
    `<layer>.weight` [out, in]."""
    if fmt.method not in _READERS:
        return shapes
    layers = _layers(shapes, fmt)
    taken = {t for parts in layers.values() for t in parts.values()}
    out = {name: s for name, s in shapes.items() if name not in taken}
    for prefix, parts in layers.items():
        main = parts.get("qweight", parts.get("weight"))
        if main is None or len(shapes[main]) != 2:
            raise ModelLoadError(f"{fmt.name} layer {prefix}: no 2-D quantised weight")
        a, b = shapes[main]
        out[f"{prefix}.weight"] = {"awq": (b * 8, a), "gptq": (b, a * 32 // fmt.bits)}.get(
            fmt.method, (a, b)
        )
    return out


def stored_weight_bytes(shapes: dict[str, tuple[tuple[int, ...], str]], fmt: QuantFormat,
                        dense_bytes: int) -> int:  # fmt: skip
    """About what the model holds: each quantised layer at `fmt.held_bits_per_weight`, every
    other tensor at `dense_bytes` per element (`shapes`: name → (shape, dtype), headers)."""
    raw = {n: s for n, (s, _) in shapes.items()}
    quantised = {f"{prefix}.weight" for prefix in _layers(raw, fmt)} if fmt.method in _READERS \
        else {n for n in raw if ".experts." in n}  # fmt: skip
    total = 0.0
    for name, shape in logical_shapes(raw, fmt).items():
        count = math.prod(shape)
        total += count * fmt.held_bits_per_weight() / 8 if name in quantised else (
            count * dense_bytes)  # fmt: skip
    return int(total)
