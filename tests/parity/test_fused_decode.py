"""The CPU decoder (inferd/models/cpu_decoder.py: the decoder layers of a step in one C call,
cpu_kernels/decode_layer.c) against the same layers run op by op in PyTorch, on the embedded
model, with every kernel variant this CPU runs: for the same input and cache, each layer's output
and the cache it leaves behind, on prefill chunks from the start and from the middle of a
prompt, a step mixing them with decode rows, and pure decode steps.

Both paths round activations to two int8 terms per 32 values (16-bit precision), sum the
products exactly and attend with the same C kernel; they differ only in float rounding order
elsewhere (norms, rotation, GELU). So most layers agree to float rounding (median ~2e-6), and
now and then an activation lies within rounding of a half step of the second term, the two paths
round it apart, and it differs by 1/256 of its block's int8 step, moving that layer's output by
a bounded amount: at most ~8e-5 of its scale seen so far, on every variant tried (with one int8
term, as llama.cpp rounds, the same flips moved it by up to 5e-3). FLIP allows 6x that. A real
bug moves far more, in most layers: a wrong norm gain (median layer ~2e-1), a wrong rotation
(~4e-2), a key or value written to the wrong cache slot (the cache check: the slot stays
stale), a row attending to the wrong keys. A wrong q/k/v bias is caught by
tests/parity/test_gguf_llama_family.py, on Qwen2, which has one.

The model runs `--quantization gguf --dtype float32` (the default's weights, the dtype pinned).
"""

from __future__ import annotations

import statistics

import pytest
import torch
from kernel_variants import VARIANT_NAMES, emulated, use_variant

from inferd import LLM, SamplingParams
from inferd.engine.execution.runner import SequenceStep

FLIP = 5e-4  # the most one flipped rounding of a second term may move a layer's output (above)
ROUNDING = 1e-5  # float rounding order alone
TEXTS = ["The paged KV cache stores keys and values in blocks. " * 6,
         "Decode reads every weight once per step, " * 3, "Short prompt here."]  # fmt: skip


def relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def compare_steps(llm, tokenizer, texts: list[str], steps: list[list[tuple[int, int, int]]]):
    """Run `steps` (each a list of (text, first token, tokens)), teacher-forced, running each
    layer both ways from the same input and cache; the op-by-op result is what the next layer
    and step see."""
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
    found: dict[str, list[float]] = {"output": [], "cache": []}
    served = []
    for index, layer in enumerate(layers):
        reference, spec = layer.forward, layer.self_attn.spec

        def both(h, rope, ctx, reference=reference, index=index, spec=spec):
            served.append(decoder.serves(ctx))
            cache = ctx.kv_caches[spec.group][spec.index_in_group]
            before = cache.clone()
            expected = reference(h.clone(), rope, ctx)  # writes this step's k/v to the cache
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
        for step in steps:
            runner.execute_with_prompt_logits(
                [SequenceStep(seqs[i][a : a + n], a, tables[i]) for i, a, n in step]
            )
    finally:
        model.cpu_decoder = decoder
        for layer in layers:
            del layer.forward
    assert all(served), "every step is one the C decoder serves"
    assert len(found["output"]) == len(steps) * len(layers)
    return found


def schedule(lengths: list[int], decode: int) -> list[list[tuple[int, int, int]]]:
    """Prompts of `lengths` tokens: the first text's prompt in two chunks, the others whole,
    the second chunk next to a decode row of the second text and the whole prompt of the
    third (a mixed step), then `decode` decode steps of every text."""
    prompts = [n - decode - 1 for n in lengths]
    half = prompts[0] // 2
    steps = [[(0, 0, half), (1, 0, prompts[1])]]
    if len(lengths) > 2:
        steps.append([(0, half, prompts[0] - half), (1, prompts[1], 1), (2, 0, prompts[2] + 1)])
        done = [prompts[0], prompts[1] + 1, prompts[2] + 1]
    else:
        steps.append([(0, half, prompts[0] - half), (1, prompts[1], 1)])
        done = [prompts[0], prompts[1] + 1]
    for j in range(decode):
        steps.append([(i, d + j, 1) for i, d in enumerate(done)])
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_fused_layers_match_the_pytorch_layers(gemma_tokenizer, variant, monkeypatch):
    if emulated(variant):
        pytest.skip(f"this CPU runs the {variant} kernels only emulated, too slowly for the "
                    "embedded model; tests/unit checks their bits against portable's")  # fmt: skip
    use_variant(monkeypatch, variant)  # skips, saying why, where this CPU cannot run it
    llm = LLM(quantization="gguf", dtype="float32", kv_cache_memory=64 << 20,
              max_num_batched_tokens=512)  # fmt: skip
    lengths = [len(gemma_tokenizer.encode(t)) for t in TEXTS]
    two = compare_steps(llm, gemma_tokenizer, TEXTS[:2], schedule(lengths[:2], 1))
    three = compare_steps(llm, gemma_tokenizer, TEXTS, schedule(lengths, 2))
    for key in two:
        errors = two[key] + three[key]
        assert max(errors) < FLIP, (key, errors)
        assert statistics.median(errors) < ROUNDING, (key, errors)  # most: rounding order only


@pytest.mark.slow
def test_every_step_takes_the_c_decoder(default_llm):
    model = default_llm.engine.runner.model
    decoder, served = model.cpu_decoder, []
    real_serves = decoder.serves

    def spy(ctx):
        served.append((ctx.batch.num_tokens, real_serves(ctx)))
        return served[-1][1]

    decoder.serves = spy
    try:
        out = default_llm.generate(["Hello there", "A longer prompt about caches"],
                                   SamplingParams(max_tokens=4, temperature=0))  # fmt: skip
    finally:
        del decoder.serves
    assert all(len(o.outputs[0].token_ids) == 4 for o in out)
    assert served[0] == (sum(len(o.prompt_token_ids) for o in out), True)  # the prefill step
    assert served[-1] == (2, True)  # a decode step of both sequences
    assert all(ok for _, ok in served)


def test_the_c_decoder_serves_fixed_order_steps_only(c_kernels):
    """`--attention-backend torch` means pure PyTorch, and the cpu backend outside its
    fixed-order mode attends prefill chunks in PyTorch: the C decoder (which attends in C)
    stands aside there, and for fp8 caches; the layers' own forward runs those steps."""
    from inferd.attention.backend import AttentionBatch, ForwardContext, GroupBatch
    from inferd.attention.cpu_backend import CpuAttentionBackend
    from inferd.attention.torch_backend import TorchAttentionBackend
    from inferd.models.cpu_decoder import CpuDecoder

    decoder = CpuDecoder([], c_kernels, [], [])
    group = GroupBatch(torch.tensor([16, 17]), torch.tensor([[1, 2]], dtype=torch.int32), 16,
                       None)  # fmt: skip
    batch = AttentionBatch(torch.tensor([0, 2], dtype=torch.int32),
                           torch.tensor([18], dtype=torch.int32), torch.tensor([16, 17]), [group],
                           [2], [18])  # fmt: skip
    cache = torch.zeros(2, 4, 16, 1, 8)
    for backend, caches, expected in [
        (TorchAttentionBackend(), cache, False),
        (CpuAttentionBackend(c_kernels), cache, True),
        (CpuAttentionBackend(c_kernels), cache.bfloat16(), True),
        (CpuAttentionBackend(c_kernels, fixed_order=False), cache, False),
        (CpuAttentionBackend(c_kernels), cache.to(torch.float8_e4m3fn), False),
    ]:  # fmt: skip
        assert decoder.serves(ForwardContext.for_step(batch, [[caches]], backend)) is expected
