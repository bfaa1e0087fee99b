"""PEFT adapters built by the tests: random and non-zero (`init_lora_weights=False`), saved as
a PEFT folder, with HF + peft's greedy tokens as the reference (unmerged and merged)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(hf_model, folder: Path, seed: int, r: int = 4, alpha: int = 8,
                 targets=None, rslora: bool = False, gain: float = 1.0):  # fmt: skip
    """Save a random LoRA adapter of `hf_model` to `folder`; returns the peft model (a deep
    copy of the base wraps it, so `hf_model` itself is left as it was). `gain` scales B, so
    the adapter visibly changes greedy tokens on a tiny model."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS,
                        init_lora_weights=False, use_rslora=rslora, lora_dropout=0.0)  # fmt: skip
    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(gain)
    peft_model.save_pretrained(folder)
    return peft_model


def merged(peft_model):
    """The base with the adapter merged into its weights (a copy)."""
    return copy.deepcopy(peft_model).merge_and_unload().eval()


def write_random_adapter(folder: Path, shapes: dict[str, tuple[int, int]], num_layers: int,
                         seed: int, r: int = 8, alpha: int = 16, targets=None,
                         extra_config: dict | None = None) -> Path:  # fmt: skip
    """A PEFT-format adapter folder written directly (for a model with no HF twin: the tiny
    GGUF files): random A and B of `shapes` (module → (out, in)) in every layer."""
    import json

    from safetensors.torch import save_file

    targets = targets or ALL_TARGETS
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(num_layers):
        for module in targets:
            out, inp = shapes[module]
            where = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            name = f"base_model.model.model.layers.{layer}.{where}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(r, inp, generator=gen) / inp**0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(out, r, generator=gen) * 0.3
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
              "bias": "none", "modules_to_save": None, "use_rslora": False}  # fmt: skip
    config.update(extra_config or {})
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
