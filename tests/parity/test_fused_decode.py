"""The gguf mode's one-call decoder layer (cpu_kernels/decode_layer.c) against the same layer run
op by op, on the embedded model, with every kernel variant this CPU runs: for the same input and
cache, each layer's output and the cache it leaves behind.

Both paths round activations to int8 per 32 values and sum the products exactly; they differ
only in float rounding order elsewhere (norms, rotation, GELU, attention). So most layers agree
to float rounding, and now and then an activation lies within rounding of a half step, the two
paths round it apart, and one int8 activation differs by one step (1/127 of its block's largest
value), moving that layer's output by a bounded amount: at most ~5e-3 of its scale seen so far,
on every variant, thread count and CPU tried. FLIP allows 4x that. A real bug moves far more,
in most layers: a wrong norm gain (median layer ~2e-1), a wrong rotation (~4e-2), a key or value
written to the wrong cache slot (the cache check: the slot stays stale). A wrong q/k/v bias is
caught by tests/parity/test_gguf_llama_family.py, on Qwen2, which has one.

The model runs in float32 (dtype pinned: the default differs by CPU, and with it the prefill
that fills the cache).
"""

from __future__ import annotations

import statistics

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library

from inferd import LLM
from inferd.engine.runner import SequenceStep

FLIP = 2e-2  # the most one flipped int8 rounding may move a layer's output (see above)
ROUNDING = 1e-5  # float rounding order alone


def relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def compare_decode_steps(llm, tokenizer, texts: list[str], steps: int) -> dict[str, list[float]]:
    """Prefill `texts` op by op, then decode `steps` teacher-forced tokens of all of them
    together, calling each layer both ways; the op-by-op result is what the next layer and
    step see."""
    runner = llm.engine.runner
    layers = runner.model.model.layers
    fused = [layer.fused for layer in layers]
    assert all(f is not None for f in fused)
    seqs, tables = [], []
    for i, text in enumerate(texts):
        seqs.append(tokenizer.encode(text))
        blocks = list(range(1 + 8 * i, 9 + 8 * i))  # 8 blocks of 16 tokens per sequence
        tables.append([blocks] * len(runner.kv_caches))
        runner.clear_blocks(tables[-1])
    for layer in layers:
        layer.fused = None
    prompts = [len(ids) - steps for ids in seqs]
    runner.execute_with_prompt_logits(
        [SequenceStep(ids[:p], 0, t) for ids, p, t in zip(seqs, prompts, tables)]
    )

    used = torch.tensor(sorted({b for t in tables for b in t[0]}))  # blocks the test cleared
    found = {"output": [], "cache": []}
    for layer, fast in zip(layers, fused):
        reference, spec = layer.forward, layer.self_attn.spec

        def both(h, rope, ctx, reference=reference, fast=fast, spec=spec):
            cache = ctx.kv_caches[spec.group][spec.index_in_group]
            before = cache.clone()
            expected = reference(h.clone(), rope, ctx)  # writes this token's k/v to the cache
            expected_cache = cache.clone()
            cache.copy_(before)
            got = fast(h.clone(), rope, ctx)  # from the same cache
            assert got is not None, "a pure decode step must take the fused path"
            found["output"].append(relative(got, expected))
            found["cache"].append(relative(cache[:, used], expected_cache[:, used]))
            cache.copy_(expected_cache)
            return expected

        layer.forward = both
    for step in range(steps):
        runner.execute_with_prompt_logits([
            SequenceStep(ids[p + step : p + step + 1], p + step, t)
            for ids, p, t in zip(seqs, prompts, tables)
        ])  # fmt: skip
    for layer, fast in zip(layers, fused):
        del layer.forward
        layer.fused = fast
    assert len(found["output"]) == steps * len(layers)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, variant, monkeypatch):
    variant_library(variant)  # skips, saying why, where this CPU cannot run it
    monkeypatch.setenv("INFERD_CPU_KERNELS", variant)
    llm = LLM(quantization="gguf", dtype="float32", kv_cache_memory=64 << 20,
              max_num_batched_tokens=512)  # fmt: skip
    texts = ["The paged KV cache stores keys and values in blocks. " * 6,
             "Decode reads every weight once per step, " * 3, "Short prompt here."]  # fmt: skip
    found = compare_decode_steps(llm, gemma_tokenizer, texts[:1], 2)  # one sequence
    three = compare_decode_steps(llm, gemma_tokenizer, texts, 3)  # several together
    for key in found:
        errors = found[key] + three[key]
        assert max(errors) < FLIP, (key, errors)
        assert statistics.median(errors) < ROUNDING, (key, errors)  # most: rounding order only


@pytest.mark.slow
def test_prefill_steps_take_the_pytorch_path(c_kernels):
    from inferd import SamplingParams

    llm = LLM(quantization="gguf", kv_cache_memory=64 << 20)
    layer = llm.engine.runner.model.model.layers[0]
    fused, served = layer.fused, []

    def spy(h, rope, ctx):
        out = fused(h, rope, ctx)
        served.append(out is not None)
        return out

    layer.fused = spy
    out = llm.generate(["Hello there", "A longer prompt about caches"],
                       SamplingParams(max_tokens=4, temperature=0))  # fmt: skip
    assert all(len(o.outputs[0].token_ids) == 4 for o in out)
    assert served[0] is False  # the prefill step
    assert served[-1] is True  # a decode step
