"""Memory accounting: the worked examples, KV against the engine's real pool, tensor parallelism,
capacity planning, size parsing and the `inferd memory` command. Config arithmetic only, except
where a test builds a tiny model to compare with the runner's real KV tensors."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig
from inferd.memory.activations import estimate_activations
from inferd.memory.estimate import engine_kv_pool, estimate_memory
from inferd.memory.kv import kv_bytes_per_token_per_layer
from inferd.memory.weights import count_parameters, tp_shard, valid_tp_sizes, weight_bytes

KiB, GiB = 1 << 10, 1 << 30


def llama(layers=32, hidden=4096, heads=32, kv=8, inter=14336, vocab=128256, **kw) -> ModelConfig:
    return ModelConfig(architecture="llama", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=inter, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv, head_dim=hidden // heads,
                       max_position_embeddings=kw.pop("max_pos", 8192), **kw)  # fmt: skip


LLAMA3_8B = llama()
LLAMA3_70B = llama(layers=80, hidden=8192, heads=64, kv=8, inter=28672)
GEMMA_LIKE = ModelConfig(
    architecture="gemma3", vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=6,
    num_heads=4, num_kv_heads=1, head_dim=32, tie_word_embeddings=True, qk_norm=True,
    layer_types=(SLIDING_ATTENTION,) * 5 + (FULL_ATTENTION,), sliding_window=64,
    max_position_embeddings=4096,
)  # fmt: skip


# ---- the worked examples ---------------------------------------------------------------------
def test_seven_billion_parameters_by_precision():
    n = 7_000_000_000
    assert weight_bytes(n, "fp32") == 28_000_000_000
    assert weight_bytes(n, "fp16") == weight_bytes(n, "bfloat16") == 14_000_000_000
    assert weight_bytes(n, "int8") == weight_bytes(n, "fp8") == 7_000_000_000
    assert weight_bytes(n, "int4") == 3_500_000_000


def test_int8_rows_hold_their_scale():
    """int8: head_dim codes and a float32 scale per token, KV head and layer, for K and V."""
    est = estimate_memory(LLAMA3_8B, dtype="bf16", kv_cache_dtype="int8", device="cuda")
    assert est.kv_bytes_per_token == 2 * 32 * 8 * (128 + 4)  # 66 KiB, bf16's 128 KiB
    gemma = estimate_memory(GEMMA_LIKE, dtype="fp32", kv_cache_dtype="int8")
    assert gemma.kv_bytes_per_token_per_layer == 2 * 1 * (32 + 4)


def test_llama3_70b_kv_per_token_is_320_kib_in_bf16():
    est = estimate_memory(LLAMA3_70B, dtype="bf16", device="cuda", max_model_len=4096)
    assert est.kv_bytes_per_token == 320 * KiB  # 2 × 80 layers × 8 heads × 128 × 2 bytes
    assert est.kv_bytes_per_request == 4096 * 320 * KiB
    fp8 = estimate_memory(LLAMA3_70B, dtype="bf16", kv_cache_dtype="fp8", device="cuda")
    assert fp8.kv_bytes_per_token == 160 * KiB


def test_published_llama3_parameter_counts():
    # Meta's published totals for these shapes (untied head, GQA).
    assert count_parameters(LLAMA3_8B).total == 8_030_261_248
    assert count_parameters(LLAMA3_70B).total == 70_553_706_496


def test_config_only_folder_is_estimated_without_weights(tmp_path, capsys):
    cfg = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = run_cli(capsys, str(tmp_path), "--json", "--device", "cuda", "--device-memory", "80GiB",
                  "--max-model-len", "8192", "--concurrency", "4")  # fmt: skip
    assert out["checkpoint"] is None and out["format"] == "hf"
    assert out["params"]["total"] == 8_030_261_248
    assert out["weights_by_precision"]["bf16"] == 16_060_522_496
    assert out["kv_bytes_per_token"] == 128 * KiB
    assert out["per_device"]["kv_formula"] == 4 * 8192 * 128 * KiB
    assert out["fits"] is True and out["min_tensor_parallel_size"] == 1
    assert out["device_memory_source"] == "--device-memory"


# ---- KV: the formula, the window cap and the engine's real pool -----------------------------
def test_sliding_layers_are_capped_at_their_window():
    est = estimate_memory(GEMMA_LIKE, dtype="fp32", max_model_len=1000)
    per_layer = 2 * 1 * 32 * 4
    assert est.kv_bytes_per_token_per_layer == per_layer
    assert est.kv_bytes_per_token == 6 * per_layer
    assert est.kv_bytes_per_request == per_layer * (1000 + 5 * 64)
    assert est.kv_bytes_per_request_uncapped == per_layer * 6 * 1000
    short = estimate_memory(GEMMA_LIKE, dtype="fp32", max_model_len=40)
    assert short.kv_bytes_per_request == short.kv_bytes_per_request_uncapped == per_layer * 6 * 40


TINY_LLAMA = llama(layers=3, hidden=64, heads=4, kv=2, inter=128, vocab=300)


@pytest.mark.parametrize("kv, kv_dtype", [("fp32", torch.float32), ("int8", torch.int8)])
@pytest.mark.parametrize("config", [TINY_LLAMA, GEMMA_LIKE], ids=["llama", "gemma"])
def test_kv_figures_equal_the_runner_pool(config, kv, kv_dtype):
    """int8: the estimate counts each row's 4-byte scale as the runner allocates it."""
    from inferd.engine.execution.runner import ModelRunner
    from inferd.memory.estimate import KV_ELEMENTS
    from inferd.memory.kv import kv_element
    from inferd.models.registry import model_class

    est = estimate_memory(config, dtype="fp32", kv_cache_dtype=kv, max_model_len=200,
                          concurrency=3)  # fmt: skip
    assert KV_ELEMENTS[kv] == kv_element(kv_dtype)  # what the engine's setup plans with
    pool = est.per_device.kv_pool
    model = model_class(config.architecture)(config, torch.float32)
    runner = ModelRunner(model, pool.num_blocks, pool.block_size, kv_dtype, torch.device("cpu"))
    assert runner.kv_cache_bytes() == est.per_device.kv_cache == pool.total_bytes
    for g, (_, layers) in enumerate(config.kv_groups()):
        group = sum(t.numel() * t.element_size() for t in runner.kv_caches[g])
        per_token = group / (pool.num_blocks[g] * pool.block_size)
        assert per_token == len(layers) * est.kv_bytes_per_token_per_layer
    if all(w is None for w, _ in config.kv_groups()):
        # Full attention only: the pool's bytes over its token slots is the per-token figure.
        assert runner.kv_cache_bytes() / (pool.num_blocks[0] * pool.block_size) == (
            est.kv_bytes_per_token
        )
    # The pool holds what it was sized for (None: every layer slides, any length fits).
    assert pool.token_capacity is None or pool.token_capacity >= 3 * 200


def test_engine_pool_is_the_smallest_that_holds_the_requests():
    kw = dict(dtype_bytes=2, block_size=16, max_num_batched_tokens=64)
    pool = engine_kv_pool(LLAMA3_8B, 2, 100, **kw)
    assert pool.num_blocks == [2 * 7 + 1]  # ceil(100 / 16) blocks each, plus the null block
    assert pool.total_bytes == 15 * 16 * 128 * KiB
    sliding = engine_kv_pool(GEMMA_LIKE, 2, 1000, **kw)
    assert sliding.token_capacity >= 2 * 1008
    assert sliding.num_blocks[1] < sliding.num_blocks[0]  # the window caps the sliding pool


# ---- tensor parallelism and capacity ---------------------------------------------------------
def test_tensor_parallel_split():
    shard = tp_shard(LLAMA3_70B, 8)
    assert (shard.num_heads, shard.num_kv_heads) == (8, 1)
    est8 = estimate_memory(LLAMA3_70B, dtype="bf16", device="cuda", tensor_parallel_size=8)
    assert est8.kv_bytes_per_token_per_device == 40 * KiB
    # 16 ranks, 8 KV heads: each rank keeps one KV head (replicated), so KV stops shrinking.
    est16 = estimate_memory(LLAMA3_70B, dtype="bf16", device="cuda", tensor_parallel_size=16)
    assert est16.kv_bytes_per_token_per_device == 40 * KiB
    # Everything but the replicated norms is split in two.
    norms = count_parameters(LLAMA3_8B).layer_norms + LLAMA3_8B.hidden_size
    est2 = estimate_memory(LLAMA3_8B, dtype="bf16", device="cuda", tensor_parallel_size=2)
    assert est2.params_per_device == (est2.params.total - norms) // 2 + norms
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        tp_shard(LLAMA3_8B, 3)
    with pytest.raises(ValueError, match="KV heads"):
        tp_shard(llama(hidden=24 * 128, heads=24, kv=8), 12)  # 12 neither divides 8 nor is k×8


def test_capacity_answers_are_the_edges_of_fitting():
    kw = dict(dtype="bf16", device="cuda", max_model_len=8192, device_memory=40 * GiB)
    est = estimate_memory(LLAMA3_8B, concurrency=2, **kw)
    c = est.max_concurrency
    assert c > 2
    assert estimate_memory(LLAMA3_8B, concurrency=c, **kw).fits
    assert not estimate_memory(LLAMA3_8B, concurrency=c + 1, **kw).fits
    big = dict(kw, concurrency=64)
    est = estimate_memory(LLAMA3_8B, **big)
    assert not est.fits
    n = est.max_context
    assert 0 < n < 8192
    assert estimate_memory(LLAMA3_8B, **dict(big, max_model_len=n)).fits
    assert not estimate_memory(LLAMA3_8B, **dict(big, max_model_len=n + 1)).fits
    tp = est.min_tensor_parallel_size
    assert tp is not None and tp > 1
    assert estimate_memory(LLAMA3_8B, tensor_parallel_size=tp, **big).fits
    assert not estimate_memory(LLAMA3_8B, tensor_parallel_size=tp // 2, **big).fits


def test_too_small_device_fits_nothing():
    est = estimate_memory(LLAMA3_70B, dtype="bf16", device="cuda", device_memory=24 * GiB,
                          max_model_len=4096)  # fmt: skip
    assert est.fits is False and est.max_concurrency == 0 and est.max_context == 0
    assert est.min_tensor_parallel_size == 8  # 141 GB of bf16 weights over 24 GiB devices


# ---- activations -----------------------------------------------------------------------------
def test_activation_terms():
    kw = dict(num_tokens=256, context_len=1024, act_bytes=2)
    one, many = (estimate_activations(LLAMA3_8B, num_seqs=s, **kw) for s in (1, 64))
    logits = {t.name: t.bytes for t in many.terms}["logits"]
    assert logits == 64 * LLAMA3_8B.vocab_size * (2 + 4)  # model dtype, then float32
    assert {t.name: t.bytes for t in many.terms}["sampling"] == 64 * LLAMA3_8B.vocab_size * 4
    assert many.phases["lm head + sampling"] > one.phases["lm head + sampling"]
    residual = 2 * 256 * 4096 * 2
    assert many.peak_bytes == residual + max(
        sum(t.bytes for t in many.terms if t.phase == p) for p in many.phases
    )
    fused = estimate_activations(LLAMA3_8B, num_seqs=1, attention_backend="fused", **kw)
    assert "attention scores" not in {t.name for t in fused.terms}
    assert fused.phases["attention"] < one.phases["attention"]


# ---- parsing and the command -----------------------------------------------------------------
def test_parse_size():
    from inferd.sizes import parse_size

    assert parse_size("80GiB") == 80 * GiB
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("24G") == parse_size("24gi") == 24 * GiB
    assert parse_size("1.5 GiB") == 3 * GiB // 2
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1073741824") == GiB
    for bad in ("", "GiB", "80 XB", "-5G", "1e9"):
        with pytest.raises(ValueError, match="cannot parse"):
            parse_size(bad)


def parser() -> argparse.ArgumentParser:
    from inferd.commands import memory

    p = argparse.ArgumentParser(prog="inferd memory")
    memory.add_arguments(p)
    return p


def run_cli(capsys, *argv: str) -> dict:
    from inferd.commands import memory

    assert memory.run(parser().parse_args(list(argv))) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("flag", "value"), [("--device-memory", "lots"),
                                             ("--device-memory", "0"), ("--concurrency", "0"),
                                             ("--max-model-len", "x")])  # fmt: skip
def test_bad_flags_are_named(capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        parser().parse_args([flag, value])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_bad_values_raise_value_error(tmp_path):
    from inferd.commands import memory

    for argv, message in ((["--dtype", "int3"], "precision"), (["--kv-cache-dtype", "int4"],
                          "kv_cache_dtype"), (["--max-model-len", "999999"], "limit"),
                          (["--tensor-parallel-size", "3"], "tensor_parallel_size")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            memory.run(parser().parse_args([*argv, "--device", "cpu"]))


def test_embedded_model_json(capsys):
    out = run_cli(capsys, "--json", "--device", "cpu", "--dtype", "bf16",
                  "--max-model-len", "4096", "--concurrency", "8")  # fmt: skip
    assert out["format"] == "gguf" and out["params"]["total"] == 268_098_176
    ck = out["checkpoint"]
    assert (
        ck["num_params"] == 268_098_176 and ck["data_bytes"] < out["weights_by_precision"]["int8"]
    )
    assert 4 < ck["bits_per_weight"] < 8.5 and set(ck["by_type"]) >= {"Q8_0", "Q4_K"}
    # 3 full layers × 4096 + 15 sliding layers × 512 tokens, 1 KV head of 256, bf16.
    assert out["kv_bytes_per_request"] == 2 * 256 * 2 * (3 * 4096 + 15 * 512)
    assert (
        out["per_device"]["total"]
        == sum(out["per_device"][k] for k in ("weights", "kv_cache"))
        + out["per_device"]["activations"]["peak_bytes"]
        + out["per_device"]["overhead"]["bytes"]
    )
    assert out["device_memory"] > 0 and isinstance(out["max_concurrency"], int)


def test_table_output_names_every_section(capsys):
    from inferd.commands import memory

    assert memory.run(parser().parse_args(["--device", "cpu", "--device-memory", "4GiB"])) == 0
    text = capsys.readouterr().out
    for heading in ("Parameters", "Weights", "KV cache", "KV dtypes", "Activations",
                    "Per device", "Capacity"):  # fmt: skip
        assert heading in text
    assert "268,098,176" in text and "matches the config" in text


def test_contexts_by_kv_dtype(capsys):
    """`inferd memory` per KV dtype: int8 counts its scales (9,360 bytes a token on the embedded
    model: 18 layers x 2 x 1 KV head x (256 + 4)), and each row's capacity is the estimate's own
    for that dtype."""
    from inferd.memory.kv_dtypes import kv_dtype_capacities

    out = run_cli(capsys, "--json", "--device", "cpu", "--max-model-len", "4096",
                  "--device-memory", "4GiB", "--kv-cache-dtype", "int8")  # fmt: skip
    rows = {r["kv_dtype"]: r for r in out["kv_dtypes"]}
    assert rows["int8"]["bytes_per_token"] == 18 * 2 * (256 + 4) == out["kv_bytes_per_token"]
    assert rows["int8"]["max_concurrency"] == out["max_concurrency"]
    assert rows["bf16"]["bytes_per_token"] == 18 * 2 * 256 * 2 and not rows["fp16"]["runs_here"]
    # 3 full layers x 4096 + 15 sliding x 512 tokens, per 1 GiB
    assert rows["int8"]["contexts_4k_per_gib"] == GiB // (2 * 260 * (3 * 4096 + 15 * 512))
    fits = [rows[kv]["max_concurrency"] for kv in ("fp8", "int8", "bf16")]
    assert fits[0] >= fits[1] > fits[2]
    (eight,) = [r for r in kv_dtype_capacities(LLAMA3_8B, max_model_len=4096, device="cuda",
                                               dtype="bf16") if r.kv_dtype == "int8"]  # fmt: skip
    assert eight.contexts_4k_per_gib == GiB // (4096 * 2 * 32 * 8 * 132) == 3  # bf16: 2
    assert eight.max_concurrency is None  # no device memory: no capacity


def test_kv_per_layer_formula_is_kv_py():
    # One formula in one place: the estimate reports kv.py's figure, not its own.
    est = estimate_memory(LLAMA3_70B, dtype="bf16", device="cuda")
    assert est.kv_bytes_per_token_per_layer == kv_bytes_per_token_per_layer(LLAMA3_70B, 2)
    assert math.isclose(est.kv_bytes_per_token / est.kv_bytes_per_token_per_layer, 80)


# ---- measurement -----------------------------------------------------------------------------
def test_proc_status_reads_this_process():
    from inferd.memory.measure import proc_status

    st = proc_status()
    assert st["VmRSS"] > 10 * (1 << 20) and st["VmHWM"] >= st["VmRSS"]
    assert st["RssAnon"] + st["RssFile"] <= st["VmRSS"]


class _FakeOutput:
    def __init__(self, n_prompt: int, n_gen: int):
        self.prompt_token_ids = list(range(n_prompt))
        self.outputs = [argparse.Namespace(token_ids=list(range(n_gen)))]


def _touched(size: int):
    """Fresh anonymous memory with every page written. NOTE: not a tensor, because the heap may
    hold freed memory from earlier tests (inferd keeps it), which would not add to RSS."""
    import mmap

    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # RssAnon, not shmem
    for i in range(0, size, 4096):
        buf[i] = 1
    return buf


class _FakeLLM:
    """Stands in for the engine to test the measuring itself: allocates (and touches) what it
    is told, as the engine would."""

    def __init__(self, kv_cache_memory: int, **engine_arguments):
        self.pool = _touched(kv_cache_memory)

    def generate(self, prompts, params, use_tqdm=True):
        self.scratch = _touched(32 << 20)  # 32 MiB of temporaries
        return [_FakeOutput(10, params.max_tokens) for _ in prompts]

    def rank_reports(self) -> list[dict]:
        return []

    def shutdown(self) -> None:
        pass


def test_measure_reports_rss_deltas():
    from inferd.memory import measure as m

    est = estimate_memory(LLAMA3_8B, dtype="fp32", max_model_len=2048, concurrency=2)
    assert est.per_device.kv_cache > 256 << 20
    result = m.measure_memory(None, LLAMA3_8B, est, max_tokens=3, make_llm=_FakeLLM)
    assert result.prompt_tokens == 20 and result.generated_tokens == 6
    assert [s.label for s in result.snapshots] == ["before load", "after load", "after generation"]
    rows = {what: (pred, got) for what, pred, got, _ in result.rows}
    pred, got = rows["load: weights + KV pool (anonymous RSS)"]
    # The fake engine allocates only the KV pool; the prediction adds the weights on top.
    assert got >= 0.95 * est.per_device.kv_cache and pred > est.per_device.kv_cache
    assert rows["generation: activations of this run"][1] >= 30 << 20


def test_measure_refuses_what_if_precisions():
    from inferd.memory.measure import measure_memory

    for kw in (dict(dtype="int4"), dict(dtype="fp32", kv_cache_dtype="fp8"),
               dict(dtype="fp32", tensor_parallel_size=2, device="cuda")):  # fmt: skip
        est = estimate_memory(GEMMA_LIKE, max_model_len=64, **kw)
        with pytest.raises(ValueError, match="--measure"):
            measure_memory(None, GEMMA_LIKE, est, make_llm=_FakeLLM)


# ---- Mixture of Experts: total vs active, decode reads, expert parallelism -------------------
def qwen3_30b_a3b(**kw) -> ModelConfig:
    from inferd.config import MoEConfig

    moe = MoEConfig(num_experts=128, top_k=8, intermediate_size=768, normalize_top_k=True)
    return ModelConfig(architecture="qwen3_moe", vocab_size=151936, hidden_size=2048,
                       intermediate_size=6144, num_layers=48, num_heads=32, num_kv_heads=4,
                       head_dim=128, qk_norm=True, max_position_embeddings=40960, moe=moe,
                       **kw)  # fmt: skip


def test_moe_total_and_active_parameters():
    config = qwen3_30b_a3b()
    p = count_parameters(config)
    per_expert = 3 * 2048 * 768
    assert p.experts == 48 * 128 * per_expert
    assert p.experts_per_token == 48 * 8 * per_expert
    router = 48 * 128 * 2048
    assert p.mlp == p.experts + router  # no shared expert, no dense layer
    assert p.active == p.total - p.experts + p.experts_per_token
    dense = count_parameters(llama(layers=2, hidden=64, heads=4, kv=2, inter=128, vocab=300))
    assert dense.experts == dense.experts_per_token == 0 and dense.active == dense.total


def test_decode_reads_the_experts_the_step_routes_to():
    config = qwen3_30b_a3b()
    p = count_parameters(config)
    est = estimate_memory(config, dtype="bf16", device="cuda", max_model_len=4096, concurrency=16)
    # one sequence: the active parameters, the head's whole matrix, one embedding row
    one = p.active - p.embedding + config.hidden_size
    assert est.decode_read_bytes[1] == 2 * one
    # sixteen: each expert is missed by all 16 with probability (1 - 8/128)^16
    hit = 1 - (1 - 8 / 128) ** 16
    sixteen = p.total - p.embedding - p.experts + round(p.experts * hit) + 16 * 2048
    assert est.decode_read_bytes[16] == 2 * sixteen
    assert est.decode_read_bytes[1] < est.decode_read_bytes[16] < 2 * p.total
    dense = estimate_memory(LLAMA3_8B, dtype="bf16", device="cuda", max_model_len=4096)
    assert dense.decode_read_bytes == {1: 2 * (dense.params.total - dense.params.embedding + 4096)}


def test_expert_parallel_splits_whole_experts():
    config = qwen3_30b_a3b()
    shard = tp_shard(config, 4)
    assert (shard.moe.num_experts, shard.moe.top_k) == (32, 8)
    few = config.with_overrides(moe=config.moe.__class__(32, 8, 768, True))
    assert tp_shard(few, 16).moe.top_k == 2  # a rank holds 2 experts: at most 2 per token
    est = estimate_memory(config, dtype="bf16", device="cuda", tensor_parallel_size=4,
                          max_model_len=4096)  # fmt: skip
    assert count_parameters(shard).experts == count_parameters(config).experts // 4
    assert est.params_per_device == count_parameters(shard).total
    six = config.with_overrides(moe=config.moe.__class__(6, 2, 768, True))
    with pytest.raises(ValueError, match="must divide the model's 6 experts"):
        tp_shard(six, 4)  # 4 divides the 32 heads and the 4 KV heads, not the experts
    assert 4 not in valid_tp_sizes(six) and 2 in valid_tp_sizes(six)
    with pytest.raises(ValueError, match="cannot be split"):
        tp_shard(config.with_overrides(architecture="olmoe"), 2)


def test_capacity_planner_counts_the_expert_parallel_degree():
    config = qwen3_30b_a3b()
    kw = dict(dtype="bf16", device="cuda", max_model_len=4096, device_memory=24 * GiB)
    est = estimate_memory(config, **kw)
    assert not est.fits  # 61 GB of bf16 weights
    n = est.min_tensor_parallel_size
    assert n == 4  # 2 devices hold 30.5 GB each: more than 24 GiB
    assert estimate_memory(config, tensor_parallel_size=n, **kw).fits
    assert not estimate_memory(config, tensor_parallel_size=n // 2, **kw).fits


def test_moe_activations_have_an_experts_phase():
    config = qwen3_30b_a3b()
    acts = estimate_activations(config, num_tokens=256, num_seqs=4, context_len=1024, act_bytes=2)
    names = {t.name: t for t in acts.terms}
    assert "MLP intermediate" not in names  # every layer is sparse
    assert names["expert intermediate"].bytes == 4 * 256 * 8 * 768 * 2
    assert names["rows by expert"].phase == "experts"
    mixed = config.with_overrides(moe=config.moe.__class__(128, 8, 768, True, dense_layers=(0,)))
    assert "MLP intermediate" in {t.name for t in estimate_activations(
        mixed, num_tokens=256, num_seqs=4, context_len=1024, act_bytes=2).terms}  # fmt: skip


def test_memory_command_shows_total_active_and_decode_reads(tmp_path, capsys):
    from inferd.commands import memory

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "vocab_size": 151936, "max_position_embeddings": 40960, "norm_topk_prob": True,
    }))  # fmt: skip
    args_list = [str(tmp_path), "--device", "cuda", "--device-memory", "24GiB", "--dtype", "bf16",
                 "--max-model-len", "4096", "--concurrency", "8"]  # fmt: skip
    args = parser().parse_args(args_list)
    assert memory.run(args) == 0
    text = capsys.readouterr().out
    assert "30,532,122,624" in text and "3,353,032,704" in text  # total, active
    assert "active per token" in text and "Decode: weights read per step" in text
    assert memory.run(parser().parse_args([*args_list, "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"]["active"] == 3_353_032_704
    assert set(out["decode_read_bytes"]) == {"1", "8"}
    assert out["min_tensor_parallel_size"] == 4
