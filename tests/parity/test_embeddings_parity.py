"""Embeddings (`LLM.embed`) against HF transformers' final hidden states (`output_hidden_states`,
the last entry: after the final norm) on tiny random models written by the test, float32:
last / mean / cls pooling, prompts longer than a step's token budget (chunked prefill), several
prompts in one batch, batched with generation, and through the engine core's process boundary."""

from __future__ import annotations

import pytest
import torch
from tiny_models import hf_greedy, make_tiny_checkpoint

from inferd import LLM, PoolingParams, SamplingParams

# Lengths around the 16-token budget: one chunk, exactly one, several.
PROMPTS = [[1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63], [1, 5, 6, 7], list(range(4, 40)),
           list(range(100, 116))]  # fmt: skip
BUDGET = 16


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    """(HF model, inferd LLM) of one tiny family; the LLM's steps hold 16 tokens at most."""
    import transformers

    folder = make_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    llm = LLM(str(folder), dtype="float32", max_num_batched_tokens=BUDGET,
              kv_cache_memory=4 << 20)  # fmt: skip
    return hf, llm


def assert_vector(got: list[float], ref: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got), ref, rtol=1e-5, atol=1e-5)


def hf_pooled(hf, prompt: list[int], pooling_type: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]
    return {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling_type]


@pytest.mark.parametrize("pooling_type", ["last", "mean", "cls"])
def test_pooled_hidden_states_match_hf(tiny, pooling_type):
    hf, llm = tiny
    params = PoolingParams(pooling_type=pooling_type, normalize=False)
    outs = llm.embed(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.prompt_token_ids == prompt and out.finished and out.error is None
        assert_vector(out.outputs.embedding, hf_pooled(hf, prompt, pooling_type))


def test_normalised_by_default_and_truncated_before_normalising(tiny):
    hf, llm = tiny
    ref = hf_pooled(hf, PROMPTS[2], "last")
    (out,) = llm.embed([PROMPTS[2]], use_tqdm=False)  # the model's default: last, normalised
    assert_vector(out.outputs.embedding, torch.nn.functional.normalize(ref, dim=0))
    # --pooler-config would allow `dimensions`; the resolved params reach the device as they are.
    engine = llm.engine
    saved = engine.inputs.pooler
    try:
        from dataclasses import replace

        engine.inputs.pooler = replace(saved, is_matryoshka=True)
        (cut,) = llm.embed([PROMPTS[2]], PoolingParams(dimensions=8), use_tqdm=False)
    finally:
        engine.inputs.pooler = saved
    assert_vector(cut.outputs.embedding, torch.nn.functional.normalize(ref[:8], dim=0))


def test_embedding_blocks_are_freed_and_cached_prefixes_reused(tiny):
    _, llm = tiny
    engine = llm.engine
    engine.kv.reset_prefix_cache()
    first = llm.embed([PROMPTS[2]], use_tqdm=False)[0]
    assert engine.kv.usage == 0.0 and not engine.requests  # nothing held once it finished
    again = llm.embed([PROMPTS[2]], use_tqdm=False)[0]  # last pooling: a cached prefix is fine
    assert again.num_cached_tokens > 0
    assert_vector(again.outputs.embedding, torch.tensor(first.outputs.embedding))
    # mean needs every position's hidden state: it never starts from the cache
    mean = llm.embed([PROMPTS[2]], PoolingParams(pooling_type="mean"), use_tqdm=False)[0]
    assert mean.num_cached_tokens == 0


def test_embeddings_batch_with_generation(tiny):
    """Embedding prompts are scheduled with generating ones in the same steps; neither
    changes the other's result."""
    hf, llm = tiny
    engine = llm.engine
    engine.kv.reset_prefix_cache()
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    mixed_rows = []
    execute = engine.executor.execute

    def recording(record):
        kinds = {engine.scheduler.sequences[r.seq_id].request.pooling is None for r in record.rows}
        mixed_rows.append(kinds == {True, False})
        return execute(record)

    engine.executor.execute = recording
    try:
        engine.add_request("gen", {"prompt_token_ids": PROMPTS[0]}, greedy)
        engine.add_request("emb", {"prompt_token_ids": PROMPTS[2]}, PoolingParams(normalize=False))
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
    finally:
        engine.executor.execute = execute
    assert any(mixed_rows), "no step held both an embedding and a generating row"
    _, ref_tokens = hf_greedy(hf, PROMPTS[0], 6)
    assert done["gen"].outputs[0].token_ids == ref_tokens
    assert_vector(done["emb"].outputs.embedding, hf_pooled(hf, PROMPTS[2], "last"))


def test_pooling_and_sampling_params_are_not_interchangeable(tiny):
    _, llm = tiny
    with pytest.raises(ValueError, match="expected PoolingParams"):
        llm.embed(PROMPTS[:2], [PoolingParams(), SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match="expected SamplingParams"):
        llm.generate(PROMPTS[:1], PoolingParams(), use_tqdm=False)
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolingParams(pooling_type="max")
    with pytest.raises(ValueError, match="dimensions 8 is not supported"):
        llm.embed(PROMPTS[:1], PoolingParams(dimensions=8), use_tqdm=False)
    too_long = [5] * (llm.engine.max_model_len + 1)
    with pytest.raises(ValueError, match="max_model_len") as info:
        llm.embed([PROMPTS[0], too_long], use_tqdm=False)  # the first is taken back
    assert info.value.param == "input"
    assert not llm.engine.requests


def test_embeddings_cross_the_process_boundary(tiny):
    """The core in its own process (as `inferd serve` runs it): the vectors travel back as
    plain data, equal to the in-process ones."""
    hf, llm = tiny
    folder = llm.engine.setup.checkpoint.path
    remote = LLM(str(folder), dtype="float32", max_num_batched_tokens=BUDGET,
                 kv_cache_memory=4 << 20, engine_core_process=True)  # fmt: skip
    try:
        outs = remote.embed(PROMPTS, PoolingParams(pooling_type="mean", normalize=False),
                            use_tqdm=False)  # fmt: skip
    finally:
        remote.shutdown()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert_vector(out.outputs.embedding, hf_pooled(hf, prompt, "mean"))


def test_preempted_embeddings_recompute_to_the_same_vectors(tiny):
    """Six usable KV blocks: two generating requests decode while an 80-token embedding prompt
    is prefilled in chunks; when a decode needs a block, the newest request (the embedding) is
    preempted mid-prefill and later recomputed from position 0, its pooling restarted."""
    from inferd.memory.kv import block_bytes

    hf, llm = tiny
    cfg = llm.engine.model_config
    pool = 7 * sum(block_bytes(cfg, len(layers), 16, 4) for _, layers in cfg.kv_groups())
    tight = LLM(str(llm.engine.setup.checkpoint.path), dtype="float32", kv_cache_memory=pool,
                max_num_batched_tokens=BUDGET, enable_prefix_caching=False)  # fmt: skip
    engine = tight.engine
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    long = list(range(4, 84))
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(f"gen-{i}", {"prompt_token_ids": prompt}, greedy)
    for kind in ("mean", "cls", "last"):
        engine.add_request(kind, {"prompt_token_ids": long},
                           PoolingParams(pooling_type=kind, normalize=False))  # fmt: skip
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert done["mean"].metrics.num_preemptions > 0
    for kind in ("mean", "cls", "last"):
        assert_vector(done[kind].outputs.embedding, hf_pooled(hf, long, kind))
    for i, prompt in enumerate(PROMPTS[:2]):
        assert done[f"gen-{i}"].outputs[0].token_ids == hf_greedy(hf, prompt, 20)[1]
    assert engine.kv.usage == 0.0
