"""The gguf mode on a Mixture-of-Experts GGUF file (Q8_0 experts, `ffn_*_exps`): every expert
keeps its blocks (one block matrix per expert), every group of rows runs on the C block kernel,
the C decoder layer stays off (it has no Mixture of Experts), and the logits follow the float32
run of the same file within the rounding of activations to two int8 terms."""

from __future__ import annotations

import pytest
import torch
from hf_to_gguf import write_gguf
from tiny_models import make_tiny_model

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.layers.moe import ExpertBlocks, ExpertLinear
from inferd.layers.weight_scheme import WeightScheme
from inferd.loader import load_model, open_checkpoint
from inferd.models.cpu_decoder import CpuDecoder

PROMPTS = [[1, *range(20, 60)], [1, 5, 6, 7], [1, 250, 3, 99, 180, 42]]


def logits_of_steps(model, decode_steps: int = 4) -> torch.Tensor:
    """Last-position logits of a 3-prompt prefill, then of `decode_steps` decode steps of all
    three (the next token fixed: the same inputs whatever the mode)."""
    runner = ModelRunner(model, [64] * len(model.config.kv_groups()), 16, torch.float32,
                         torch.device("cpu"))  # fmt: skip
    tables = [[list(range(1 + 4 * i, 5 + 4 * i))] for i in range(len(PROMPTS))]
    out = [runner.execute([SequenceStep(p, 0, t) for p, t in zip(PROMPTS, tables)])]
    for step in range(decode_steps):
        steps = [SequenceStep([10 + step], len(p) + step, t) for p, t in zip(PROMPTS, tables)]
        out.append(runner.execute(steps))
    return torch.cat(out)


@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_gguf_mode_keeps_expert_blocks_and_follows_float32(tmp_path, monkeypatch, c_kernels,
                                                           kind):  # fmt: skip
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    hf = make_tiny_model(kind, tmp_path / "hf")
    path = write_gguf(hf, kind, tmp_path / f"{kind}.gguf", quantize=True)
    reference = logits_of_steps(load_model(open_checkpoint(path), torch.float32,
                                           torch.device("cpu")))  # fmt: skip

    scheme = WeightScheme("gguf", torch.float32, blocks=True, kernels=c_kernels)
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), scheme=scheme)
    assert model.cpu_decoder is None  # no C decoder layer for a Mixture of Experts
    assert CpuDecoder.for_model(model) is None  # and asked directly, it declines
    experts = [m for m in model.modules() if isinstance(m, ExpertLinear)]
    assert experts and all(isinstance(e.quant_method, ExpertBlocks) for e in experts)
    assert all(e.quant_method.blocks is not None and e.weight.numel() == 0 for e in experts)
    method = experts[0].quant_method
    kernels = []
    real = type(method).kernel_for
    monkeypatch.setattr(type(method), "apply_grouped", _recording(type(method).apply_grouped,
                                                                 kernels, real))  # fmt: skip
    blocks = logits_of_steps(model)
    # the prefill's large groups and decode's groups of a few rows alike: the C kernel
    assert kernels and set(kernels) == {"blocks"}, kernels
    scale = reference.abs().max()
    assert (blocks - reference).abs().max() < 0.03 * scale  # the activations' rounding


def _recording(apply_grouped, kernels: list[str], kernel_for):
    def record(self, layer, x, counts):
        kernels.extend(kernel_for(self, n) for n in counts if n)
        return apply_grouped(self, layer, x, counts)

    return record
