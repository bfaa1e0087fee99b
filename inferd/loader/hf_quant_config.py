"""An HF folder's `quantization_config`: which pre-quantised format its weights are stored in.

inferd runs a pre-quantised checkpoint's weights as they are stored, repacked at load into the
block layout of its C kernels (inferd/layers/gguf_blocks.py), never dequantised to a dense copy:

* AWQ (`quant_method: awq`, the GEMM layout): 4-bit weights, zero points, groups of 32/64/128;
* GPTQ (`gptq`): 4- or 8-bit, symmetric or not, `desc_act` (act-order) with its input order;
* compressed-tensors (`compressed-tensors`): INT8 weights (W8A8, W8A16) per channel or group,
  FP8 e4m3 weights per tensor or per channel (with or without static activation scales);
* MXFP4 (`mxfp4`, gpt-oss's experts).

Every other method (bitsandbytes, EXL2, HQQ, ...) is refused at start-up by name: loading its
tensors as if they were plain weights would give a model that computes garbage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.errors import ModelLoadError

READ = ("awq", "gptq", "compressed-tensors", "mxfp4")


@dataclass(frozen=True)
class QuantFormat:
    """How an HF checkpoint's linear weights are stored (see the module docstring)."""

    method: str  # awq | gptq | int8 | fp8 | mxfp4 (compressed-tensors names its kind)
    bits: int
    group_size: int | None  # inputs per scale; None: one scale per output row (or tensor)
    zero_points: bool = False  # asymmetric: w = (q - zero) * scale
    desc_act: bool = False  # GPTQ act-order: groups follow `g_idx`, not the input order
    gptq_v1_zeros: bool = True  # GPTQ's original format stores each zero point minus one
    activations: str | None = None  # how the checkpoint quantises activations (W8A8, FP8)
    ignore: tuple[str, ...] = field(default_factory=tuple)  # modules kept unquantised

    @property
    def name(self) -> str:
        return {"int8": "INT8", "fp8": "FP8", "awq": "AWQ", "gptq": "GPTQ",
                "mxfp4": "MXFP4"}[self.method]  # fmt: skip

    def describe(self) -> str:
        """e.g. `AWQ 4-bit, groups of 128, zero points (4.25 bits per weight in the file)`."""
        group = f"groups of {self.group_size}" if self.group_size else "per output row"
        parts = [f"{self.name} {self.bits}-bit", group]
        if self.zero_points:
            parts.append("zero points")
        if self.desc_act:
            parts.append("act-order")
        if self.activations:
            parts.append(self.activations)
        bits = f"{self.file_bits_per_weight():.2f} bits per weight in the file"
        return ", ".join(parts) + f" ({bits})"

    def held_bits_per_weight(self) -> float:
        """Bits inferd holds per weight once repacked into blocks of 32 (gguf_blocks.py): q in
        4 or 8 bits, an fp16 scale per block (fp32 where fp16 is not exact: compressed-tensors'
        float32 scales), a float32 offset per block where there are zero points."""
        if self.method == "fp8":
            return 8.0  # the bytes as stored, one float32 scale per row
        if self.method == "mxfp4":
            return 5.0  # 4-bit codes and a float32 power-of-two scale per 32
        scale = 32 if self.method == "int8" else 16
        return self.bits + (scale + (32 if self.zero_points else 0)) / 32

    def file_bits_per_weight(self) -> float:
        """Bits the checkpoint stores per weight: q, plus its fp16 scale (and packed zero)
        per group (a per-row scale costs nothing per weight at these sizes)."""
        if self.method == "mxfp4":
            return 4.25  # 4-bit values, one 8-bit exponent per 32
        per_group = 16 + (self.bits if self.zero_points else 0)
        return self.bits + (per_group / self.group_size if self.group_size else 0.0)


def read_quant_format(cfg: dict, folder: Path) -> QuantFormat | None:
    """The format of config.json `cfg` (or of GPTQ's older `quantize_config.json` beside it);
    None for an unquantised checkpoint. ModelLoadError for a method inferd does not run."""
    qc = cfg.get("quantization_config")
    source = folder / "config.json"
    if qc is None and (folder / "quantize_config.json").exists():
        from inferd.loader.hf_dir import read_json

        source = folder / "quantize_config.json"
        qc = {"quant_method": "gptq", **read_json(source)}
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ModelLoadError(f"{source}: quantization_config must be an object")
    method = qc.get("quant_method")
    if method is None:
        raise ModelLoadError(f"{source}: quantization_config has no quant_method")
    if method not in READ:
        raise ModelLoadError(
            f"{source}: the weights are quantised with {method!r}, which inferd does not run "
            f"(it reads {', '.join(READ)} checkpoints, and GGUF files); use an unquantised or "
            "a GGUF version of this model"
        )
    try:
        if method == "awq":
            return _awq(qc, source)
        if method == "gptq":
            return _gptq(qc, source)
        if method == "mxfp4":
            return QuantFormat("mxfp4", 4, 32, ignore=_names(qc, "modules_to_not_convert"))
        return _compressed_tensors(qc, source)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{source}: quantization_config ({method}): {e}") from e


def _group(value: Any, source: Path, allowed=(32, 64, 128)) -> int | None:
    """A group size: one of `allowed`, or -1/None for one group per output row."""
    if value in (-1, None):
        return None
    if value not in allowed:
        raise ValueError(f"group_size {value!r} is not one inferd runs ({allowed}, or -1)")
    return int(value)


def _names(qc: dict, key: str) -> tuple[str, ...]:
    names = qc.get(key) or ()
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{key} must be a list of module names")
    return tuple(names)


def _awq(qc: dict, source: Path) -> QuantFormat:
    bits = qc.get("bits", qc.get("w_bit"))
    version = str(qc.get("version", "gemm")).lower()
    if bits != 4:
        raise ValueError(f"AWQ with {bits} bits; inferd runs 4-bit AWQ")
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r}; inferd reads the GEMM layout ('gemm')")
    group = _group(qc.get("group_size", qc.get("q_group_size")), source)
    if group is None:
        raise ValueError("AWQ needs a group_size of 32, 64 or 128")
    return QuantFormat("awq", 4, group, zero_points=bool(qc.get("zero_point", True)),
                       ignore=_names(qc, "modules_to_not_convert"))  # fmt: skip


def _gptq(qc: dict, source: Path) -> QuantFormat:
    bits = qc.get("bits")
    if bits not in (4, 8):
        raise ValueError(f"GPTQ with {bits!r} bits; inferd runs 4- and 8-bit GPTQ")
    layout = str(qc.get("checkpoint_format", "gptq")).lower()
    if layout not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {layout!r}; inferd reads 'gptq' and 'gptq_v2'")
    return QuantFormat(
        "gptq", bits, _group(qc.get("group_size", 128), source),
        zero_points=not bool(qc.get("sym", True)), desc_act=bool(qc.get("desc_act", False)),
        gptq_v1_zeros=layout == "gptq", ignore=_names(qc, "modules_to_not_convert"),
    )  # fmt: skip


def _compressed_tensors(qc: dict, source: Path) -> QuantFormat:
    """compressed-tensors: one config group for the Linear layers (the usual export), its
    weights INT8 (channel or group strategy) or FP8 (tensor or channel strategy)."""
    kind = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError("inferd reads compressed-tensors checkpoints with one config group")
    group = next(iter(groups.values()))
    weights, acts = group.get("weights") or {}, group.get("input_activations")
    wtype, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if bits != 8 or wtype not in ("int", "float"):
        raise ValueError(f"{wtype} {bits}-bit weights (format {kind!r}); inferd reads 8-bit "
                         "int and float (FP8) weights from compressed-tensors")  # fmt: skip
    if wtype == "float" and strategy not in ("tensor", "channel"):
        raise ValueError(f"FP8 weights with the {strategy!r} strategy; inferd reads per-tensor "
                         "and per-channel FP8 scales")  # fmt: skip
    if wtype == "int" and strategy not in ("channel", "group"):
        raise ValueError(f"INT8 weights with the {strategy!r} strategy; inferd reads per-channel "
                         "and per-group INT8 scales")  # fmt: skip
    size = _group(weights.get("group_size"), source, (32, 64, 128, 256)) if strategy == "group" \
        else None  # fmt: skip
    return QuantFormat(
        "fp8" if wtype == "float" else "int8", 8, size,
        zero_points=not weights.get("symmetric", True), activations=_activations(acts),
        ignore=_names(qc, "ignore"),
    )  # fmt: skip


def _activations(acts: dict | None) -> str | None:
    """What the checkpoint says about activations, as the start-up line names it."""
    if not acts:
        return None
    kind = "FP8" if acts.get("type") == "float" else f"INT{acts.get('num_bits')}"
    how = "dynamic" if acts.get("dynamic") else "static"
    return f"{kind} activations ({how}, per {acts.get('strategy')})"
