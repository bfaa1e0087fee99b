"""The CPU decode backend (inferd/models/cpu_decoder.py: each decoder layer of a decode step as
one C call, cpu_kernels/decode_layer.c) against the same layers run op by op in PyTorch, on the
embedded model in its default CPU mode: each layer's output for the same input and cache.

The two differ only in float rounding order, and both round activations to int8 per 32 values;
so now and then one activation lands on the other side of a rounding boundary and that layer's
output moves by ~1e-4 of its scale. A bug (a wrong gain, rotation, cache slot or activation)
moves it by far more than 1e-3 in every layer."""

from __future__ import annotations

import pytest
import torch

from inferd import LLM, SamplingParams
from inferd.engine.runner import SequenceStep


@pytest.fixture(scope="module")
def default_llm(c_kernels):
    llm = LLM(kv_cache_memory=64 << 20, max_num_batched_tokens=512)
    assert llm.engine.runner.backend.name == "cpu"
    assert llm.engine.runner.model.cpu_decoder is not None, "the default mode on a GGUF file"
    return llm


@pytest.mark.slow
@pytest.mark.parametrize("sequences", [1, 3])
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, default_llm, sequences):
    runner = default_llm.engine.runner
    model = runner.model
    decoder, layers = model.cpu_decoder, model.model.layers
    texts = ["The paged KV cache stores keys and values in blocks. " * 6,
             "Decode reads every weight once per step, " * 3, "Short prompt here."]  # fmt: skip
    seqs, tables = [], []
    for i in range(sequences):
        seqs.append(gemma_tokenizer.encode(texts[i]))
        blocks = list(range(1 + 8 * i, 9 + 8 * i))  # 8 blocks of 16 tokens per sequence
        tables.append([blocks] * len(runner.kv_caches))
        runner.clear_blocks(tables[-1])
    prompts = [len(ids) - 4 for ids in seqs]
    runner.execute_with_prompt_logits(
        [SequenceStep(ids[:p], 0, t) for ids, p, t in zip(seqs, prompts, tables)]
    )

    errors, served = [], []
    for index, layer in enumerate(layers):
        reference = layer.forward

        def both(h, rope, ctx, reference=reference, index=index):
            served.append(decoder.serves(h.shape[0], ctx))
            expected = reference(h.clone(), rope, ctx)  # writes this token's k/v to the cache
            got = h.float().contiguous().clone()
            decoder.run_layer(index, got, rope, ctx)  # writes the same slots again
            errors.append(((got - expected).abs().max() / expected.abs().max()).item())
            return expected

        layer.forward = both
    model.cpu_decoder = None  # every layer through its (wrapped) PyTorch forward
    try:
        for step in range(4):  # decode steps, teacher-forced, all sequences together
            runner.execute_with_prompt_logits([
                SequenceStep(ids[p + step : p + step + 1], p + step, t)
                for ids, p, t in zip(seqs, prompts, tables)
            ])  # fmt: skip
    finally:
        model.cpu_decoder = decoder
        for layer in layers:
            del layer.forward
    assert all(served), "a pure decode step must be one the C decoder serves"
    assert len(errors) == 4 * len(layers)
    assert max(errors) < 1e-3, errors
    assert sorted(errors)[len(errors) // 2] < 1e-5, errors  # most layers: rounding order only


@pytest.mark.slow
def test_only_pure_decode_steps_take_the_c_decoder(default_llm):
    model = default_llm.engine.runner.model
    decoder, served = model.cpu_decoder, []
    real_serves = decoder.serves

    def spy(rows, ctx):
        served.append((rows, real_serves(rows, ctx)))
        return served[-1][1]

    decoder.serves = spy
    try:
        out = default_llm.generate(["Hello there", "A longer prompt about caches"],
                                   SamplingParams(max_tokens=4, temperature=0))  # fmt: skip
    finally:
        del decoder.serves
    assert all(len(o.outputs[0].token_ids) == 4 for o in out)
    assert served[0][1] is False  # the prefill step
    assert served[-1] == (2, True)  # a decode step of both sequences
    assert not any(ok for rows, ok in served if rows > decoder.max_rows)


def test_the_torch_backend_never_runs_c(c_kernels):
    """`--attention-backend torch` means pure PyTorch: the C decoder (which attends in C)
    stands aside, and the layers' own forward runs every step."""
    from inferd.attention.backend import AttentionBatch, ForwardContext, GroupBatch
    from inferd.attention.cpu_backend import CpuAttentionBackend
    from inferd.attention.torch_backend import TorchAttentionBackend
    from inferd.models.cpu_decoder import CpuDecoder

    decoder = CpuDecoder([], c_kernels, max_rows=8)
    group = GroupBatch(torch.tensor([17]), torch.tensor([[1, 2]], dtype=torch.int32), 16, None)
    batch = AttentionBatch(torch.tensor([0, 1], dtype=torch.int32),
                           torch.tensor([18], dtype=torch.int32), torch.tensor([17]), [group],
                           [1], [18])  # fmt: skip
    caches = [[torch.zeros(2, 4, 16, 1, 8)]]
    for backend, expected in [(TorchAttentionBackend(), False),
                              (CpuAttentionBackend(c_kernels), True)]:  # fmt: skip
        assert decoder.serves(1, ForwardContext.for_step(batch, caches, backend)) is expected
    cpu = ForwardContext.for_step(batch, caches, CpuAttentionBackend(c_kernels))
    assert not decoder.serves(9, cpu)  # more rows than it takes
    bf16 = ForwardContext.for_step(
        batch, [[caches[0][0].bfloat16()]], CpuAttentionBackend(c_kernels)
    )
    assert not decoder.serves(1, bf16)  # it reads float32 caches only
