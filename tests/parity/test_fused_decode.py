"""The CPU decode backend (inferd/models/cpu_decoder.py: each decoder layer of a decode step as
one C call, cpu_kernels/decode_layer.c) against the same layers run op by op in PyTorch, on the
embedded model, with every kernel variant this CPU runs: for the same input and cache, each
layer's output and the cache it leaves behind.

Both paths round activations to two int8 terms per 32 values (16-bit precision) and sum the
products exactly; they differ only in float rounding order elsewhere (norms, rotation, GELU,
attention). So most layers agree to float rounding (median ~2e-6), and now and then an
activation lies within rounding of a half step of the second term, the two paths round it
apart, and it differs by 1/256 of its block's int8 step, moving that layer's output by a
bounded amount: at most ~8e-5 of its scale seen so far, on every variant tried (with one int8
term, as llama.cpp rounds, the same flips moved it by up to 5e-3). FLIP allows 6x that. A real
bug moves far more, in most layers: a wrong norm gain (median layer ~2e-1), a wrong rotation
(~4e-2), a key or value written to the wrong cache slot (the cache check: the slot stays
stale). A wrong q/k/v bias is caught by tests/parity/test_gguf_llama_family.py, on Qwen2, which
has one.

The model runs the blocks with float32 GEMMs (`--quantization gguf --dtype float32`: the dtype
pinned, since the default differs by CPU, and with it the prefill that fills the cache).
"""

from __future__ import annotations

import statistics

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library

from inferd import LLM, SamplingParams
from inferd.engine.runner import SequenceStep

FLIP = 5e-4  # the most one flipped rounding of a second term may move a layer's output (above)
ROUNDING = 1e-5  # float rounding order alone
TEXTS = ["The paged KV cache stores keys and values in blocks. " * 6,
         "Decode reads every weight once per step, " * 3, "Short prompt here."]  # fmt: skip


def relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def compare_decode_steps(llm, tokenizer, texts: list[str], steps: int) -> dict[str, list[float]]:
    """Prefill `texts` op by op, then decode `steps` teacher-forced tokens of all of them
    together, running each layer both ways from the same input and cache; the op-by-op result
    is what the next layer and step see."""
    runner = llm.engine.runner
    model = runner.model
    decoder, layers = model.cpu_decoder, model.model.layers
    assert decoder is not None, "blocks with kernels: the C decoder is built"
    seqs, tables = [], []
    for i, text in enumerate(texts):
        seqs.append(tokenizer.encode(text))
        blocks = list(range(1 + 8 * i, 9 + 8 * i))  # 8 blocks of 16 tokens per sequence
        tables.append([blocks] * len(runner.kv_caches))
        runner.clear_blocks(tables[-1])
    used = torch.tensor(sorted({b for t in tables for b in t[0]}))  # blocks the test cleared
    prompts = [len(ids) - steps for ids in seqs]
    found: dict[str, list[float]] = {"output": [], "cache": []}
    served = []
    for index, layer in enumerate(layers):
        reference, spec = layer.forward, layer.self_attn.spec

        def both(h, rope, ctx, reference=reference, index=index, spec=spec):
            if h.shape[0] != len(texts):  # the prefill: op by op only
                return reference(h, rope, ctx)
            served.append(decoder.serves(h.shape[0], ctx))
            cache = ctx.kv_caches[spec.group][spec.index_in_group]
            before = cache.clone()
            expected = reference(h.clone(), rope, ctx)  # writes this token's k/v to the cache
            expected_cache = cache.clone()
            cache.copy_(before)
            got = h.float().contiguous().clone()
            decoder.run_layer(index, got, rope, ctx)  # from the same cache
            found["output"].append(relative(got, expected))
            found["cache"].append(relative(cache[:, used], expected_cache[:, used]))
            cache.copy_(expected_cache)
            return expected

        layer.forward = both
    model.cpu_decoder = None  # every layer through its (wrapped) PyTorch forward
    try:
        runner.execute_with_prompt_logits(
            [SequenceStep(ids[:p], 0, t) for ids, p, t in zip(seqs, prompts, tables)]
        )
        for step in range(steps):
            runner.execute_with_prompt_logits([
                SequenceStep(ids[p + step : p + step + 1], p + step, t)
                for ids, p, t in zip(seqs, prompts, tables)
            ])  # fmt: skip
    finally:
        model.cpu_decoder = decoder
        for layer in layers:
            del layer.forward
    assert all(served), "a pure decode step must be one the C decoder serves"
    assert len(found["output"]) == steps * len(layers)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, variant, monkeypatch):
    variant_library(variant)  # skips, saying why, where this CPU cannot run it
    monkeypatch.setenv("INFERD_CPU_KERNELS", variant)
    llm = LLM(quantization="gguf", dtype="float32", kv_cache_memory=64 << 20,
              max_num_batched_tokens=512)  # fmt: skip
    one = compare_decode_steps(llm, gemma_tokenizer, TEXTS[:1], 2)  # one sequence
    three = compare_decode_steps(llm, gemma_tokenizer, TEXTS, 3)  # several together
    for key in one:
        errors = one[key] + three[key]
        assert max(errors) < FLIP, (key, errors)
        assert statistics.median(errors) < ROUNDING, (key, errors)  # most: rounding order only


@pytest.fixture(scope="module")
def default_llm(c_kernels):
    llm = LLM(kv_cache_memory=64 << 20, max_num_batched_tokens=512)
    assert llm.engine.runner.backend.name == "cpu"
    assert llm.engine.runner.model.cpu_decoder is not None, "the default mode on a GGUF file"
    return llm


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
