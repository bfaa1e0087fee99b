"""Parameter counts three ways, which must agree: from the config (`count_parameters`), from the
checkpoint's tensor directory (GGUF tensor infos / safetensors headers), and from the loaded
model (`sum(p.numel())`), on the embedded model and every tiny checkpoint; HF transformers'
own count of the same checkpoint is the outside reference."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_models import TINY_CONFIGS, make_tiny_checkpoint

from inferd.loader import load_model, open_checkpoint
from inferd.memory.weights import checkpoint_weights, count_parameters, weight_bytes


def numel(model: torch.nn.Module) -> int:
    # named_parameters() yields a tied (shared) tensor once, like the count should.
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", sorted(TINY_CONFIGS))
def test_tiny_checkpoint_counts(kind, tmp_path):
    import transformers

    folder = make_tiny_checkpoint(kind, tmp_path / kind)
    ckpt = open_checkpoint(folder)
    counts = count_parameters(ckpt.config)
    model = load_model(ckpt, torch.float32, torch.device("cpu"))
    assert counts.total == numel(model)
    assert counts.embedding == model.model.embed_tokens.weight.numel()
    assert counts.lm_head == (0 if ckpt.config.tie_word_embeddings else counts.embedding)
    on_disk = checkpoint_weights(ckpt)
    assert on_disk is not None and on_disk.num_params == counts.total
    assert on_disk.data_bytes == 4 * on_disk.stored_params  # saved in float32
    assert on_disk.file_bytes > on_disk.data_bytes  # plus the safetensors headers
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert hf.num_parameters() == counts.total


# Published Mixture-of-Experts shapes → (model_type, active parameters as published, billions)
PUBLISHED_MOE = {
    "Mixtral-8x7B": ("mixtral", 12.9, dict(
        architectures=["MixtralForCausalLM"], hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    "Qwen3-30B-A3B": ("qwen3_moe", 3.3, dict(
        architectures=["Qwen3MoeForCausalLM"], hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, norm_topk_prob=True)),
    "OLMoE-1B-7B": ("olmoe", 1.3, dict(
        architectures=["OlmoeForCausalLM"], hidden_size=2048, intermediate_size=1024,
        num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, num_experts=64,
        num_experts_per_tok=8, vocab_size=50304)),
    "Qwen1.5-MoE-A2.7B": ("qwen2_moe", 2.7, dict(
        architectures=["Qwen2MoeForCausalLM"], hidden_size=2048, intermediate_size=5632,
        moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, num_experts=60, num_experts_per_tok=4,
        vocab_size=151936)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED_MOE))
def test_published_moe_counts_equal_hf_and_the_active_share(name):
    """Total: HF transformers' count of the same config (built on the meta device: no memory);
    active: the figure the model's authors publish (the "A3B" of Qwen3-30B-A3B)."""
    import transformers

    from inferd.loader.hf_config import model_config_from_hf

    model_type, active_b, cfg = PUBLISHED_MOE[name]
    counts = count_parameters(model_config_from_hf(dict(cfg, max_position_embeddings=4096)))
    hf_cfg = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items()
                                                              if k != "architectures"})  # fmt: skip
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert counts.total == hf.num_parameters()
    # published to two or three significant figures (Qwen's "3.3B" is 3.35B: truncated)
    assert abs(counts.active / 1e9 - active_b) < 0.02 * active_b


def test_embedded_model_counts(gemma_gguf):
    ckpt = open_checkpoint(None)
    counts = count_parameters(ckpt.config)
    on_disk = checkpoint_weights(ckpt)
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"))
    assert counts.total == numel(model) == on_disk.num_params == 268_098_176
    assert counts.lm_head == 0  # tied: the 262144 × 640 matrix is counted once
    assert counts.embedding == 262_144 * 640
    # The loaded bf16 weights take exactly what the estimate says.
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    assert held == weight_bytes(counts.total, "bf16")
    # The Q4_K_M file: mostly 4-8 bit blocks, so its data is under 1 byte per weight.
    assert on_disk.data_bytes == sum(t.n_bytes for t in ckpt.gguf.tensors.values())
    assert 4 < on_disk.bits_per_weight < 8.5
    assert on_disk.file_bytes == os.path.getsize(gemma_gguf)
    assert sum(n for n, _ in on_disk.by_type.values()) == sum(
        math.prod(t.shape) for t in ckpt.gguf.tensors.values()
    )


def test_the_default_modes_weights_are_what_the_plan_says(gemma_gguf, c_kernels):
    """`inferd memory`'s figure for the default mode on a GGUF file (weight_plan.py) against the
    model the engine builds in that mode: every block and dense tensor it holds after load,
    which is all it ever holds (every step multiplies by the blocks)."""
    from inferd.layers.block_method import BlockMethod
    from inferd.layers.weight_scheme import choose_scheme
    from inferd.memory.estimate import estimate_memory
    from inferd.memory.weight_plan import block_plan

    ckpt = open_checkpoint(None)
    scheme = choose_scheme(None, "auto", "gguf", torch.device("cpu"))
    assert scheme.blocks, scheme.describe()
    plan = block_plan(checkpoint_weights(ckpt))
    assert plan.scheme == scheme.name
    model = load_model(ckpt, scheme.dtype, torch.device("cpu"), scheme=scheme)
    methods = [m for m in model.modules() if isinstance(m, BlockMethod) and m.blocks is not None]
    held = sum(m.blocks.nbytes for m in methods)
    held += sum(p.numel() * p.element_size() for p in model.parameters())
    assert held == plan.held, (held, plan.held)
    # about the file's size: blocks store q in 4, 5 or 8 bits and scales as the file does, or fp32
    assert 0.9 < plan.held / os.path.getsize(gemma_gguf) < 1.1
    # the estimate counts these in the engine's conditions only: the default dtype, a CPU,
    # no tensor parallelism, the kernels available; its KV cache is then bfloat16, as the engine's
    on_disk = checkpoint_weights(ckpt)
    est = estimate_memory(ckpt.config, checkpoint=on_disk, block_kernels=True, max_model_len=512)
    assert est.per_device.weights == plan.total and est.kv_cache_dtype == "bf16"
    for other in (dict(block_kernels=False), dict(block_kernels=True, dtype="fp32"),
                  dict(block_kernels=True, device="cuda")):  # fmt: skip
        dense = estimate_memory(ckpt.config, checkpoint=on_disk, max_model_len=512, **other)
        assert not dense.weight_plan.blocks
        assert dense.per_device.weights == weight_bytes(on_disk.num_params, dense.dtype)


_MEASURE = textwrap.dedent("""
    from inferd import LLM
    from inferd.memory.estimate import estimate_memory
    from inferd.memory.measure import measure_memory
    from inferd.loader import open_checkpoint
    cfg = open_checkpoint(None).config
    est = estimate_memory(cfg, dtype="fp32", device="cpu", max_model_len=512, concurrency=2,
                          max_num_batched_tokens=256)
    m = measure_memory(None, cfg, est, max_tokens=4, make_llm=LLM)
    rows = {what: (pred, got) for what, pred, got, _ in m.rows}
    pred, got = rows["load: weights + KV pool (anonymous RSS)"]
    assert m.generated_tokens == 8, m.generated_tokens
    # The weights are written at load, so the growth covers them; on top come what glibc keeps
    # of the float32 load buffers (the largest, the embedding, and its raw bytes and
    # conversions) and the tokenizer: less than two embedding-sized float32 buffers.
    buffer = cfg.vocab_size * cfg.hidden_size * 4
    assert est.per_device.weights <= got <= pred + 2 * buffer, (pred, got)
    assert m.snapshots[2].rss_peak >= m.snapshots[1].rss
    print("measured", rows)
""")


@pytest.mark.slow
def test_measure_with_the_engine():
    try:
        import inferd.llm  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("inferd.llm (the engine's offline API) is not in this build yet")
    # A subprocess, so the engine's memory does not mix with this process's and a hang fails.
    try:
        proc = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("loading and generating with the engine took over 300 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
