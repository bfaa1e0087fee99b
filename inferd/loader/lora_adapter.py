"""A PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`), read and
checked: which projections of which layers it changes, its rank and its scale.

    y = x W^T + scale * (x A^T) B^T      A [r, in], B [out, r]
    scale = lora_alpha / r   (rslora: lora_alpha / sqrt(r))

What inferd computes is exactly that sum, so what PEFT can express beyond it is refused here,
with the config key named, rather than served differently: `modules_to_save` (whole modules
replaced), DoRA, trained biases, per-module ranks or alphas (`rank_pattern`, `alpha_pattern`),
`layers_to_transform`, `fan_in_fan_out`, and targets other than the seven decoder projections.
Reading is cheap for the config (`read_adapter_config`: the front end checks a request's adapter
before queueing it) and the tensors come only with `load_adapter`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from inferd.errors import InvalidRequest

# PEFT's module names of the decoder projections inferd can adapt.
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (Gemma 3 multimodal
# checkpoints add language_model.)
_TENSOR = re.compile(r"^base_model\.model\.(?:model\.)?(?:language_model\.)?layers\.(\d+)\."
                     r"(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")  # fmt: skip


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    scale: float
    targets: tuple[str, ...]  # a subset of SUPPORTED_TARGETS


@dataclass
class LoRAAdapter:
    config: AdapterConfig
    # (layer, projection name) → (A [r, in], B [out, r]) in float32
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def _refuse(key: str, why: str) -> InvalidRequest:
    return InvalidRequest("lora_request", f"LoRA adapter: {key} {why}")


def read_adapter_config(path: str | Path, max_rank: int | None = None) -> AdapterConfig:
    """The folder's adapter_config.json, checked; raises InvalidRequest naming the key."""
    folder = Path(path)
    file = folder / CONFIG_FILE
    if not file.is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise InvalidRequest("lora_request", f"LoRA adapter folder {str(folder)!r} must hold "
                             f"{CONFIG_FILE} and {WEIGHTS_FILE}")  # fmt: skip
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise _refuse(CONFIG_FILE, f"cannot be read: {e}") from e
    if raw.get("peft_type", "LORA") != "LORA":
        raise _refuse("peft_type", f"is {raw.get('peft_type')!r}; only LORA is served")
    r = raw.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _refuse("r", f"must be a positive integer, got {r!r}")
    if max_rank is not None and r > max_rank:
        raise _refuse("r", f"is {r}, above max_lora_rank ({max_rank}); raise --max-lora-rank")
    alpha = raw.get("lora_alpha", 8)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise _refuse("lora_alpha", f"must be a number, got {alpha!r}")
    for key, unsupported in (("modules_to_save", None), ("rank_pattern", {}),
                             ("alpha_pattern", {}), ("layers_to_transform", None)):  # fmt: skip
        if raw.get(key) not in (unsupported, None, [], {}):
            raise _refuse(key, f"is {raw[key]!r}; inferd serves plain low-rank updates only")
    if raw.get("use_dora"):
        raise _refuse("use_dora", "is set; DoRA adapters are not supported")
    if raw.get("bias", "none") != "none":
        raise _refuse("bias", f"is {raw['bias']!r}; only 'none' is supported")
    if raw.get("fan_in_fan_out"):
        raise _refuse("fan_in_fan_out", "is set; the decoder projections store [out, in]")
    targets = raw.get("target_modules")
    if targets == "all-linear":
        targets = list(SUPPORTED_TARGETS)
    if isinstance(targets, str) or not targets:
        raise _refuse("target_modules", f"must list module names, got {targets!r}")
    bad = sorted(set(targets) - set(SUPPORTED_TARGETS))
    if bad:
        raise _refuse("target_modules", f"has {bad}; supported: {list(SUPPORTED_TARGETS)}")
    scale = alpha / (math.sqrt(r) if raw.get("use_rslora") else r)
    return AdapterConfig(r, float(scale), tuple(t for t in SUPPORTED_TARGETS if t in targets))


def load_adapter(
    path: str | Path, num_layers: int, shapes: dict[str, tuple[int, int]],
    max_rank: int | None = None,
) -> LoRAAdapter:  # fmt: skip
    """The adapter's tensors, checked against the model: `shapes` maps each projection name to
    its (out, in) features. Raises InvalidRequest on a tensor that does not fit."""
    config = read_adapter_config(path, max_rank)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(Path(path) / WEIGHTS_FILE), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            m = _TENSOR.match(name)
            if m is None:
                raise _refuse(WEIGHTS_FILE, f"has tensor {name!r}, which is no LoRA A/B matrix "
                              "of a decoder projection")  # fmt: skip
            layer, module, half = int(m[1]), m[2], m[3]
            if module not in config.targets or not 0 <= layer < num_layers:
                raise _refuse(WEIGHTS_FILE, f"has tensor {name!r} outside target_modules or "
                              f"the model's {num_layers} layers")  # fmt: skip
            halves.setdefault((layer, module), {})[half] = f.get_tensor(name).float()
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        out, inp = shapes[module]
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None:
            raise _refuse(WEIGHTS_FILE, f"layer {layer} {module} lacks its lora_A or lora_B")
        if tuple(a.shape) != (config.rank, inp) or tuple(b.shape) != (out, config.rank):
            raise _refuse(WEIGHTS_FILE, f"layer {layer} {module}: A {tuple(a.shape)} and B "
                          f"{tuple(b.shape)}, the model needs ({config.rank}, {inp}) and "
                          f"({out}, {config.rank})")  # fmt: skip
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    if not weights:
        raise _refuse(WEIGHTS_FILE, "holds no LoRA tensors")
    return LoRAAdapter(config, weights)
