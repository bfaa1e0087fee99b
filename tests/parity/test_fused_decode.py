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
@pytest.mark.parametrize("sequences", [1, 3])
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, c_kernels, sequences):
    llm = LLM(quantization="gguf", kv_cache_memory=64 << 20, max_num_batched_tokens=512)
    runner = llm.engine.runner
    layers = runner.model.model.layers
    fused = [layer.fused for layer in layers]
    assert all(f is not None for f in fused)
    texts = ["The paged KV cache stores keys and values in blocks. " * 6,
             "Decode reads every weight once per step, " * 3, "Short prompt here."]  # fmt: skip
    seqs, tables = [], []
    for i in range(sequences):
        seqs.append(gemma_tokenizer.encode(texts[i]))
        blocks = list(range(1 + 8 * i, 9 + 8 * i))  # 8 blocks of 16 tokens per sequence
        tables.append([blocks] * len(runner.kv_caches))
        runner.clear_blocks(tables[-1])
    for layer in layers:
        layer.fused = None
    prompts = [len(ids) - 4 for ids in seqs]
    runner.execute_with_prompt_logits(
        [SequenceStep(ids[:p], 0, t) for ids, p, t in zip(seqs, prompts, tables)]
    )

    errors = []
    for layer, fast in zip(layers, fused):
        reference = layer.forward

        def both(h, rope, ctx, reference=reference, fast=fast):
            expected = reference(h.clone(), rope, ctx)  # writes this token's k/v to the cache
            got = fast(h.clone(), rope, ctx)  # writes the same slots again
            assert got is not None, "a pure decode step must take the fused path"
            errors.append(((got - expected).abs().max() / expected.abs().max()).item())
            return expected

        layer.forward = both
    for step in range(4):  # decode steps, teacher-forced, all sequences together
        runner.execute_with_prompt_logits([
            SequenceStep(ids[p + step : p + step + 1], p + step, t)
            for ids, p, t in zip(seqs, prompts, tables)
        ])  # fmt: skip
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
