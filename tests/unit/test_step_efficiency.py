"""A step's bytes read and FLOPs (inferd/profiling/model_traffic.py) against hand-computed values
for tiny layers, and MBU / MFU from them (inferd/profiling/efficiency_meter.py,
inferd/step_efficiency.py): milliseconds, no model file."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from inferd.config import ModelConfig, MoEConfig
from inferd.layers.block_method import BlockMethod
from inferd.layers.embedding import LMHead, VocabEmbedding
from inferd.layers.gguf_blocks import BlockWeight
from inferd.layers.linear import Linear
from inferd.layers.moe import Experts
from inferd.profiling import efficiency_meter as em
from inferd.profiling.model_traffic import ModelTraffic, keys_attended, matrices
from inferd.step_efficiency import KindEfficiency, PeakRates, StepEfficiency, StepWork

F32 = torch.float32


def tiny_config(**changes) -> ModelConfig:
    fields = dict(architecture="llama", vocab_size=8, hidden_size=4, intermediate_size=3,
                  num_layers=2, num_heads=2, num_kv_heads=1, head_dim=2, sliding_window=3,
                  layer_types=("sliding_attention", "full_attention"))  # fmt: skip
    return ModelConfig(**{**fields, **changes})


class TinyModel(nn.Module):
    """Two layers of q/k/v (8 x 4), o (4 x 4), up (6 x 4) in float32, a tied head (8 x 4)."""

    def __init__(self, moe: MoEConfig | None = None):
        super().__init__()
        self.embed = VocabEmbedding(8, 4, F32)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"qkv": Linear(4, [4, 2, 2], scheme=F32), "o": Linear(4, 4, scheme=F32),
                           "up": Linear(4, 6, scheme=F32)})
            for _ in range(2)
        )  # fmt: skip
        if moe is not None:
            self.experts = Experts(tiny_config(moe=moe), as_dense(), 0, moe.num_experts)
        self.head = LMHead(8, 4, F32, tied=self.embed)


def as_dense():
    from inferd.layers.weight_scheme import WeightScheme

    return WeightScheme.dense(F32)


KV_TOKEN_BYTES = [16.0, 16.0]  # per group: 1 layer x (K, V) x 1 KV head x 2 dims x 4 bytes


@pytest.mark.parametrize("window", [None, 1, 3, 5, 40])
@pytest.mark.parametrize(("start", "n"), [(0, 1), (0, 7), (2, 4), (5, 1), (9, 3), (3, 0)])
def test_keys_attended_is_the_sum_over_queries(start, n, window):
    cap = window or 10**9
    expected = sum(min(p + 1, cap) for p in range(start, start + n))
    assert keys_attended(start, n, window) == expected


def test_dense_step_bytes_and_flops_by_hand():
    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    # a decode row at 5 cached tokens, and a 4-token prompt chunk from the start; both sample
    work = traffic.work([(5, 1, 1), (0, 4, 1)])
    layer_weights = 2 * (8 * 4 + 4 * 4 + 6 * 4)  # 144
    # every layer matrix once, the 5 tokens' embedding rows (4 floats), the tied head once
    assert work.weight_bytes == 4 * layer_weights + 5 * 16 + 4 * 8 * 4
    # KV read: full layer: 6 + 4 tokens; sliding (3): min(6, 3) + min(4, 3); 16 bytes each
    assert work.kv_bytes == 16 * (6 + 4) + 16 * (3 + 3)
    # 2 FLOPs per weight per token (5 tokens), per head weight per logits row (2 rows), and
    # attention: 4 x 2 heads x 2 dims per key, keys: full 6 + (1+2+3+4), sliding 3 + (1+2+3+3)
    attention = 16 * (6 + 10) + 16 * (3 + 9)
    assert work.flops == {"float32": 2 * 5 * layer_weights + 2 * 2 * 32 + attention}


def test_no_logits_rows_read_no_head():
    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    with_head = traffic.work([(0, 4, 1)])
    without = traffic.work([(0, 4, 0)])  # a prompt chunk that is not the last: no sampling
    assert with_head.weight_bytes - without.weight_bytes == 4 * 8 * 4
    assert with_head.total_flops - without.total_flops == 2 * 32


def test_tensor_parallel_counts_every_rank():
    one = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    two = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32, ranks=2)
    a, b = one.work([(5, 1, 1)]), two.work([(5, 1, 1)])
    assert b.weight_bytes - 16 == 2 * (a.weight_bytes - 16)  # the embedding row is whole
    assert b.kv_bytes == 2 * a.kv_bytes


def test_experts_read_at_most_the_tokens_choices():
    moe = MoEConfig(num_experts=4, top_k=2, intermediate_size=3, normalize_top_k=True)
    traffic = ModelTraffic.of_model(TinyModel(moe), tiny_config(moe=moe), KV_TOKEN_BYTES, F32)
    dense = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    expert_weights = 6 * 4 + 4 * 3  # one expert's [gate; up] (6 x 4) and down (4 x 3)

    def extra(rows):
        a, b = traffic.work(rows), dense.work(rows)
        return a.weight_bytes - b.weight_bytes, a.total_flops - b.total_flops

    assert extra([(5, 1, 1)]) == (2 * 4 * expert_weights, 2 * 2 * expert_weights)
    # 3 tokens choose 6 times among 4 experts: at most all 4 read, FLOPs for all 6 choices
    assert extra([(0, 3, 1)]) == (4 * 4 * expert_weights, 2 * 6 * expert_weights)


def random_blocks(ggml_type: int, scales_at: tuple[int, ...], rows: int, cols: int):
    """A BlockWeight of a GGUF type: random bytes, finite fp16 scales."""
    import numpy as np

    from inferd.loader import gguf_quants as gq

    per_block, nbytes = gq.BLOCK_LAYOUT[ggml_type]
    raw = np.random.default_rng(0).integers(0, 256, (rows * cols // per_block, nbytes), np.uint8)
    for at in scales_at:
        raw[:, at : at + 2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    return BlockWeight(*gq.unpack(raw, ggml_type, (rows, cols)))


def test_gguf_blocks_are_counted_in_their_own_format():
    q4_k, q8_0 = random_blocks(12, (0, 2), 32, 256), random_blocks(8, (0,), 32, 256)
    layer = Linear(256, 64, scheme=F32)
    method = layer.quant_method = BlockMethod()
    method.install(layer, BlockWeight(parts=[*q4_k.parts, *q8_0.parts]))
    found = matrices(layer, 64, 256)
    assert [m.fmt for m in found] == ["q4_k", "q8_0"]
    assert [m.macs for m in found] == [32 * 256, 32 * 256]
    assert sum(m.bytes for m in found) == method.blocks.nbytes
    # about 4.5 and 8.5 bits a weight: a block format's bytes, not float32's
    assert found[0].bytes < found[1].bytes < 32 * 256 * 4 / 3


PEAKS = PeakRates("test machine", 1000.0, {"float32": 4000.0, "q4_k": 8000.0})


def test_step_work_against_peaks():
    work = StepWork(weight_bytes=300.0, kv_bytes=100.0, flops={"float32": 2000.0, "q4_k": 4000.0})
    assert work.memory_seconds(PEAKS) == 0.4
    assert work.compute_seconds(PEAKS) == 2000.0 / 4000.0 + 4000.0 / 8000.0
    assert work.compute_seconds(PeakRates("m", 1.0, {"float32": 1.0})) is None  # q4_k unknown


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def row(start: int, n: int, logits: bool = True):
    return SimpleNamespace(num_computed=start, num_new_tokens=n, draft_token_ids=[],
                           needs_logits=logits, prompt_logprobs=False)  # fmt: skip


def test_meter_without_peaks_counts_but_rates_nothing():
    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    meter = em.EfficiencyMeter(traffic, lambda: None, FakeClock())
    meter.observe([row(5, 1)], 0.5, prefill=False)
    snap = meter.snapshot()
    decode = snap.kinds["decode"]
    expected = traffic.work([(5, 1, 1)])
    assert (decode.steps, decode.weight_bytes, decode.kv_bytes) == (
        1, expected.weight_bytes, expected.kv_bytes)  # fmt: skip
    assert snap.peaks is None and decode.mean_mbu is None and decode.bound is None
    assert decode.mbu.count == 0 and "mbu" not in snap.last
    assert snap.kinds["prefill"].steps == 0


def test_meter_with_peaks_rates_each_step():
    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    meter = em.EfficiencyMeter(traffic, lambda: PEAKS, FakeClock())
    meter.observe([row(0, 4)], 2.0, prefill=True)
    work = traffic.work([(0, 4, 1)])
    prefill = meter.snapshot().kinds["prefill"]
    assert prefill.mean_mbu == pytest.approx(work.bytes / 1000.0 / 2.0)
    assert prefill.mean_mfu == pytest.approx(work.total_flops / 4000.0 / 2.0)
    assert prefill.mbu.count == prefill.mfu.count == 1
    assert prefill.bound == ("memory" if work.bytes / 1000 > work.total_flops / 4000 else "compute")
    assert meter.snapshot().last["mbu"] == pytest.approx(prefill.mean_mbu)


def test_meter_looks_for_peaks_again_later_and_survives_a_broken_source():
    clock, answers = FakeClock(), [RuntimeError("damaged"), None, PEAKS]
    asked = []

    def source():
        asked.append(clock.now)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, F32)
    meter = em.EfficiencyMeter(traffic, source, clock)
    for t in (0.0, 1.0, em.RETRY_SECONDS + 1, em.RETRY_SECONDS + 2, 2 * em.RETRY_SECONDS + 2,
              2 * em.RETRY_SECONDS + 3):  # fmt: skip
        clock.now = t
        meter.observe([row(5, 1)], 0.1, prefill=False)
    assert asked == [0.0, em.RETRY_SECONDS + 1, 2 * em.RETRY_SECONDS + 2]  # then kept
    decode = meter.snapshot().kinds["decode"]
    assert decode.steps == 6 and decode.mbu.count == 2
    assert decode.rated_seconds == pytest.approx(0.2)


def test_a_meter_without_a_model_records_nothing():
    meter = em.EfficiencyMeter(None)
    meter.observe([row(5, 1)], 0.1, prefill=False)
    assert meter.snapshot().kinds["decode"].steps == 0


def test_drafts_and_prompt_logprobs_need_logits_rows():
    r = SimpleNamespace(num_computed=7, num_new_tokens=1, draft_token_ids=[3, 4],
                        needs_logits=True, prompt_logprobs=False)  # fmt: skip
    p = SimpleNamespace(num_computed=0, num_new_tokens=5, draft_token_ids=[],
                        needs_logits=True, prompt_logprobs=True)  # fmt: skip
    assert list(em.step_rows([r, p])) == [(7, 3, 3), (0, 5, 6)]


def test_spans_subtract_and_replicas_add():
    a = KindEfficiency(steps=3, seconds=1.5, weight_bytes=30.0, rated_seconds=1.5,
                       memory_seconds=0.6)  # fmt: skip
    b = KindEfficiency(steps=1, seconds=0.5, weight_bytes=10.0, rated_seconds=0.5,
                       memory_seconds=0.1)  # fmt: skip
    span = a.minus(b)
    assert (span.steps, span.weight_bytes, span.mean_mbu) == (2, 20.0, pytest.approx(0.5))
    total = StepEfficiency({"decode": a, "prefill": b}).plus(
        StepEfficiency({"decode": b, "prefill": a}, PEAKS)
    )
    assert total.kinds["decode"].steps == 4 and total.peaks == PEAKS
