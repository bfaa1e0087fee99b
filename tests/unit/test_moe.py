"""The Mixture-of-Experts layer against a plain per-token reference: routing (top-k softmax,
renormalised or not), experts grouped by expert, expert-parallel partial sums, the shared
expert, loading one expert at a time, and what it refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferd.config import ModelConfig, MoEConfig
from inferd.layers.linear_method import DenseMethod
from inferd.layers.moe import Experts, Router, SparseMoE
from inferd.layers.weight_scheme import WeightScheme

HIDDEN, INTER, EXPERTS = 16, 8, 6


def config(top_k=2, normalize=True, shared=0) -> ModelConfig:
    moe = MoEConfig(EXPERTS, top_k, INTER, normalize, shared_intermediate_size=shared,
                    shared_gate=bool(shared))  # fmt: skip
    return ModelConfig("qwen3_moe", 32, HIDDEN, 24, 1, 2, 1, 8, moe=moe)


def filled(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def reference(x, router_w, gate_up, down, top_k, normalize) -> torch.Tensor:
    """Token by token: softmax over experts, the top_k, each expert's SiLU-gated MLP."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = F.softmax(router_w @ x[t], dim=-1)
        w, chosen = probs.topk(top_k)
        w = w / w.sum() if normalize else w
        for weight, e in zip(w, chosen.tolist()):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += weight * (down[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("top_k,normalize", [(2, True), (2, False), (1, False), (6, True)])
def test_grouped_experts_equal_the_per_token_reference(top_k, normalize):
    c = config(top_k, normalize)
    moe = filled(SparseMoE(c, torch.float32))
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(1))
    got = moe(x)
    expected = reference(x, moe.gate.weight, moe.experts.gate_up_proj.weight,
                         moe.experts.down_proj.weight, top_k, normalize)  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_one_gemm_per_expert_with_rows_none_for_the_others(monkeypatch):
    moe = filled(SparseMoE(config(top_k=1), torch.float32))
    calls = []
    real = DenseMethod.apply_grouped

    def spy(self, layer, x, counts):
        calls.append(list(counts))
        return real(self, layer, x, counts)

    monkeypatch.setattr(DenseMethod, "apply_grouped", spy)
    x = torch.randn(5, HIDDEN)
    _, chosen = moe.gate(x)
    moe(x)
    expected = torch.bincount(chosen.flatten(), minlength=EXPERTS).tolist()
    assert calls == [expected, expected]  # [gate; up] then down, rows counted per expert
    assert sum(expected) == 5 and 0 in expected  # some expert had no row: no GEMM for it


def test_expert_parallel_ranks_sum_to_the_whole():
    c = config()
    whole = filled(Experts(c, WeightScheme.dense(torch.float32), 0, EXPERTS))
    halves = [Experts(c, WeightScheme.dense(torch.float32), first, 3) for first in (0, 3)]
    with torch.no_grad():
        for half in halves:
            for name in ("gate_up_proj", "down_proj"):
                mine = getattr(whole, name).weight[half.first : half.first + 3]
                getattr(half, name).weight.copy_(mine)
    x = torch.randn(7, HIDDEN)
    router = filled(Router(HIDDEN, EXPERTS, 2, True), seed=3)
    weights, chosen = router(x)
    parts = [h(x, weights, chosen) for h in halves]
    torch.testing.assert_close(parts[0] + parts[1], whole(x, weights, chosen))
    assert all(p.abs().sum() > 0 for p in parts)  # both ranks had work


def test_the_static_path_for_cuda_graphs_gives_the_same_sums():
    """What a CUDA graph captures (every expert over every row, weighted by the router, 0 where
    not chosen) equals the grouped path, here and on an expert-parallel rank's share."""
    c = config()
    x = torch.randn(6, HIDDEN)
    for first, count in ((0, EXPERTS), (3, 3)):
        experts = filled(Experts(c, WeightScheme.dense(torch.float32), first, count))
        weights, chosen = filled(Router(HIDDEN, EXPERTS, 2, True), seed=5)(x)
        torch.testing.assert_close(experts.every_expert(x, weights, chosen),
                                   experts(x, weights, chosen), rtol=1e-5, atol=1e-5)  # fmt: skip


def test_shared_expert_is_gated_and_added():
    from inferd.models.llama import GatedMLP

    c = config(shared=12)
    shared = GatedMLP(c, torch.float32, intermediate_size=12)
    moe = filled(SparseMoE(c, torch.float32, shared=shared))
    x = torch.randn(4, HIDDEN)
    routed = moe.experts(x, *moe.gate(x))
    gate = torch.sigmoid(x @ moe.shared_expert_gate.weight.t())
    torch.testing.assert_close(moe(x), routed + gate * shared(x))


class _Lazy:
    """A checkpoint tensor that counts its reads."""

    def __init__(self, tensor: torch.Tensor, reads: list[str], name: str):
        self.tensor, self.reads, self.name, self.shape = tensor, reads, name, tuple(tensor.shape)

    def load(self, dtype, rows=None, cols=None):
        self.reads.append(self.name)
        return self.tensor.to(dtype)


def test_experts_load_one_matrix_at_a_time_and_skip_other_ranks_experts():
    c = config()
    mine = Experts(c, WeightScheme.dense(torch.float32), 3, 3)  # experts 3, 4, 5
    reads: list[str] = []
    for e in range(EXPERTS):
        for kind, shape in (("gate_proj", (INTER, HIDDEN)), ("up_proj", (INTER, HIDDEN)),
                            ("down_proj", (HIDDEN, INTER))):  # fmt: skip
            name = f"{e}.{kind}.weight"
            mine.load_checkpoint_tensor(name, _Lazy(torch.full(shape, float(e)), reads, name))
        if e == 4:
            assert mine.missing_tensors() == ["5.gate_proj.weight", "5.up_proj.weight",
                                              "5.down_proj.weight"]  # fmt: skip
    assert mine.missing_tensors() == []
    assert reads == [f"{e}.{k}.weight" for e in (3, 4, 5) for k in ("gate_proj", "up_proj",
                                                                     "down_proj")]  # fmt: skip
    assert mine.gate_up_proj.weight[1, :INTER].eq(4).all()  # local 1 = expert 4, gate rows
    assert mine.down_proj.weight[2].eq(5).all()
    with pytest.raises(ValueError, match="6 experts"):
        mine.load_checkpoint_tensor("6.up_proj.weight", _Lazy(torch.zeros(1), reads, "x"))
    with pytest.raises(ValueError, match="no place"):
        mine.load_checkpoint_tensor("3.w9.weight", _Lazy(torch.zeros(1), reads, "x"))
    wrong = _Lazy(torch.zeros(INTER, HIDDEN + 1), reads, "x")
    with pytest.raises(ValueError, match="the model expects"):
        mine.load_checkpoint_tensor("3.gate_proj.weight", wrong)


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_requantising_modes_are_refused_for_experts(method):
    scheme = WeightScheme(method, torch.bfloat16, quantize=method)
    with pytest.raises(ValueError, match=f"--quantization {method} does not cover"):
        SparseMoE(config(), scheme)


def test_experts_must_divide_among_the_ranks():
    from inferd.distributed.state import TPGroup

    with pytest.raises(ValueError, match="does not divide the number of experts"):
        SparseMoE(config(), torch.float32, TPGroup(rank=0, world_size=4))


def test_experts_per_token_must_fit_the_experts():
    with pytest.raises(ValueError, match="experts per token"):
        MoEConfig(4, 5, 8, True)
