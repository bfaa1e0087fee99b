"""Speculative decoding end to end on the embedded model, default CPU mode: the outputs with it
are the outputs without it (greedy token for token, through the sliding window, stop strings
inside a draft, penalties and logprobs, seeded sampling, preemption), and an abort midway leaves
every KV block free. Drafts are verified whenever lookup finds any (`adaptive = False`), so the
paths run whatever the planner would decide on this machine."""

from __future__ import annotations

import random

import pytest

from inferd import LLM, SamplingParams
from inferd.bench.copy_text import edit_prompt, edit_sentences

pytestmark = pytest.mark.slow

CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
          "prompt_lookup_min": 2}  # fmt: skip
KV = 256 << 20


@pytest.fixture(scope="module")
def plain(default_llm):
    return default_llm  # the session's default-mode engine (its step budget differs: no matter)


@pytest.fixture(scope="module")
def spec():
    llm = LLM(kv_cache_memory=KV, speculative_config=CONFIG)
    llm.engine.speculation.adaptive = False
    return llm


def copy_prompt(llm: LLM, seed: int, sentences: int) -> list[int]:
    text = edit_prompt(edit_sentences(random.Random(seed), sentences))
    return llm.get_tokenizer().encode(text)


def ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_output_is_plain_decoding_token_for_token(plain, spec):
    rng = random.Random(0)
    prompts = [
        copy_prompt(plain, 1, 8),
        [2] + [rng.randrange(1000, 20000) for _ in range(40)],  # the model loops: lookup pays
        copy_prompt(plain, 3, 28)[:490],  # decoding crosses the 512-token sliding window
    ]
    assert len(prompts[2]) == 490
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    before = spec.engine.speculation.metrics.num_accepted_tokens
    for prompt in prompts:  # one at a time: each step verifies one sequence's rows
        assert ids(spec.generate([prompt], greedy, use_tqdm=False)) == ids(
            plain.generate([prompt], greedy, use_tqdm=False)
        )
    assert spec.engine.speculation.metrics.num_accepted_tokens - before > 32
    # Penalties count accepted drafts as output; logprobs are those of the emitted tokens.
    params = SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.2, logprobs=2,
                            presence_penalty=0.5)  # fmt: skip
    both = [llm.generate(prompts[:2], params, use_tqdm=False) for llm in (spec, plain)]
    assert ids(both[0]) == ids(both[1])
    for a, b in zip(both[0], both[1], strict=True):
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys()
            assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)


def test_a_stop_string_inside_a_draft_ends_the_output_there(plain, spec):
    prompt = copy_prompt(plain, 5, 6)
    params = SamplingParams(temperature=0, max_tokens=48)
    text = plain.generate([prompt], params, use_tqdm=False)[0].outputs[0].text
    stop = text.split()[9]  # a word of the copied text, some way in
    params = SamplingParams(temperature=0, max_tokens=48, stop=[stop])
    covered: list[range] = []  # output positions each verification emitted
    speculation = spec.engine.speculation
    verified = speculation.verified

    def record(seq, num_drafted, num_accepted):
        covered.append(range(seq.num_output_tokens, seq.num_output_tokens + num_accepted + 1))
        verified(seq, num_drafted, num_accepted)

    speculation.verified = record
    try:
        got = spec.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    finally:
        speculation.verified = verified
    want = plain.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, "stop")
    last = len(got.token_ids) - 1
    assert any(last in r and last < r[-1] for r in covered)  # tokens after it were dropped


def test_seeded_sampling_draws_the_same_tokens(plain, spec):
    rng = random.Random(1)
    looping = [2] + [rng.randrange(1000, 20000) for _ in range(30)]
    prompts = [copy_prompt(plain, 7, 6), looping, looping]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=32) for s in (11, 12, 13)]
    accepted = spec.engine.speculation.metrics.num_accepted_tokens
    got = ids(spec.generate(prompts, params, use_tqdm=False))
    assert got == ids(plain.generate(prompts, params, use_tqdm=False))
    assert got[1] != got[2]  # really sampled
    assert spec.engine.speculation.metrics.num_accepted_tokens > accepted


def test_aborting_speculating_requests_midway_frees_every_kv_block(spec):
    engine = spec.engine
    free = [p.num_free for p in engine.kv.pools]
    accepted = engine.speculation.metrics.num_accepted_tokens
    for i in range(4):
        engine.add_request(f"abort-{i}", copy_prompt(spec, 20 + i, 5),
                           SamplingParams(temperature=0, max_tokens=64))  # fmt: skip
    for _ in range(8):
        engine.step()
    assert engine.speculation.metrics.num_accepted_tokens > accepted
    for i in range(4):
        engine.abort_request(f"abort-{i}")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert [p.num_free for p in engine.kv.pools] == free
    assert len(engine.speculation.proposer) == 0


def test_preemption_mid_speculation_gives_the_same_outputs(gemma_llm):
    """In the float32 parity mode: there a sequence recomputed after preemption (a prefill)
    gets the keys and values its decode steps wrote; with GGUF blocks a prefill runs other
    kernels, and preemption alone changes outputs, speculation or not."""
    from inferd.memory.kv import block_bytes

    prompts = [copy_prompt(gemma_llm, 30 + i, 3)[:48] for i in range(3)]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    reference = ids(gemma_llm.generate(prompts, greedy, use_tqdm=False))
    cfg = gemma_llm.engine.model_config
    one_block = sum(block_bytes(cfg, len(layers), 16, 4) for _, layers in cfg.kv_groups())
    # 9 usable blocks of 16 tokens per group: 3 prompts of 3 blocks fit, their outputs do not.
    tight = LLM(dtype="float32", attention_backend="torch", kv_cache_memory=10 * one_block,
                max_model_len=128, enable_prefix_caching=False,
                speculative_config=CONFIG)  # fmt: skip
    tight.engine.speculation.adaptive = False
    assert ids(tight.generate(prompts, greedy, use_tqdm=False)) == reference
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0 and stats.spec_decode_num_accepted_tokens > 0
