"""The gguf mode's one-call decoder layer (cpu_kernels/decode_layer.c) against the same layer
run op by op in PyTorch, on the embedded model: each layer's output for the same input and cache.

The two differ only in float rounding order, and both round activations to int8 per 32 values;
so now and then one activation lands on the other side of a rounding boundary and that layer's
output moves by ~1e-4 of its scale. A bug (a wrong gain, rotation, cache slot or activation)
moves it by far more than 1e-3 in every layer."""

from __future__ import annotations

import pytest

from inferd import LLM
from inferd.engine.runner import SequenceStep


@pytest.mark.slow
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, c_kernels):
    llm = LLM(quantization="gguf", kv_cache_memory=64 << 20, max_num_batched_tokens=512)
    runner = llm.engine.runner
    layers = runner.model.model.layers
    fused = [layer.fused for layer in layers]
    assert all(f is not None for f in fused)
    ids = gemma_tokenizer.encode("The paged KV cache stores keys and values in blocks. " * 6)
    tables = [list(range(1, 2 + len(ids) // 16))] * len(runner.kv_caches)
    runner.clear_blocks(tables)
    for layer in layers:
        layer.fused = None
    prompt = len(ids) - 4
    runner.execute_with_prompt_logits([SequenceStep(ids[:prompt], 0, tables)])

    errors = []
    for layer, fast in zip(layers, fused):
        reference = layer.forward

        def both(h, rope, ctx, reference=reference, fast=fast):
            expected = reference(h.clone(), rope, ctx)  # writes this token's k/v to the cache
            got = fast(h.clone(), rope, ctx)  # writes the same slot again
            assert got is not None, "a pure decode step must take the fused path"
            errors.append(((got - expected).abs().max() / expected.abs().max()).item())
            return expected

        layer.forward = both
    for pos in range(prompt, len(ids)):  # decode steps, teacher-forced
        runner.execute_with_prompt_logits([SequenceStep(ids[pos : pos + 1], pos, tables)])
    assert len(errors) == 4 * len(layers)
    assert max(errors) < 1e-3, errors
    assert sorted(errors)[len(errors) // 2] < 1e-5, errors  # most layers: rounding order only


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
