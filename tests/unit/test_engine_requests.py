"""Engine behaviour on a tiny random checkpoint (fast): n > 1 forks, stop strings across token
boundaries, seeds, streaming hold-back, prompt logprobs, and request validation."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine.frontend.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama")
    return LLM(model=str(folder), dtype="float32", kv_cache_memory=16 << 20, max_model_len=128)


def greedy(n: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def test_n2_computes_the_prompt_once(tiny_llm):
    engine = tiny_llm.engine
    prompt = list(range(5, 45))  # 40 tokens: 2.5 blocks, so the fork copies a partial block
    engine.kv.reset_prefix_cache()
    before = engine.stats().prompt_tokens
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    out = tiny_llm.generate([prompt], params, use_tqdm=False)[0]
    assert engine.stats().prompt_tokens - before == len(prompt)
    assert [c.index for c in out.outputs] == [0, 1]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert out.outputs[0].token_ids != out.outputs[1].token_ids  # distinct samples


def test_fork_children_match_independent_runs(tiny_llm):
    # A seeded sample i uses seed + i, so each child equals a single run with that seed:
    # this checks the copied partial block and the shared full blocks hold the right KV.
    prompt = list(range(7, 30))
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    forked = tiny_llm.generate([prompt], params, use_tqdm=False)[0]
    tiny_llm.engine.kv.reset_prefix_cache()
    for i, child in enumerate(forked.outputs):
        single = params.with_changes(n=1, seed=11 + i)
        alone = tiny_llm.generate([prompt], single, use_tqdm=False)[0].outputs[0]
        assert alone.token_ids == child.token_ids


def test_stop_string_split_across_tokens(tiny_llm):
    tok = tiny_llm.get_tokenizer()
    prompt = "The quick brown fox"
    full = tiny_llm.generate([prompt], greedy(), use_tqdm=False)[0].outputs[0]
    pieces = [tok.decode([t]) for t in full.token_ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and pieces[i + 1])
    stop = pieces[k][-1] + pieces[k + 1][:1]
    start = full.text.find(stop)
    out = tiny_llm.generate([prompt], greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[:start]
    kept = tiny_llm.generate([prompt], greedy(stop=[stop], include_stop_str_in_output=True),
                             use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert kept.text == full.text[: start + len(stop)]


def test_streaming_holds_back_a_possible_stop_string(tiny_llm):
    engine = tiny_llm.engine
    full = tiny_llm.generate(["numbers"], greedy(16), use_tqdm=False)[0].outputs[0]
    stop = full.text[-3:] + "|never"  # its first characters do appear, the whole never does
    engine.add_request("s1", "numbers", greedy(16, stop=[stop]), stream=True)
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.append((out.finished, out.outputs[0].text))
    assert seen[-1] == (True, full.text)
    hold = len(stop) - 1
    for finished, text in seen[:-1]:
        assert not finished and full.text.startswith(text)
        assert len(text) <= len(full.text) - hold  # the tail that could start `stop` waits


def test_seeded_request_is_batch_invariant(tiny_llm):
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = tiny_llm.generate([[1, 50, 60, 70]], params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = [[1, 9, 9], [1, 50, 60, 70], [1, 100, 120, 140, 160]]
    others = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True), params,
              SamplingParams(temperature=0.5, seed=5, max_tokens=12, ignore_eos=True)]  # fmt: skip
    together = tiny_llm.generate(crowd, others, use_tqdm=False)[1].outputs[0].token_ids
    assert together == alone


def test_prompt_logprobs_cover_the_prompt(tiny_llm):
    prompt = list(range(20, 60))
    out = tiny_llm.generate([prompt], greedy(2, prompt_logprobs=3), use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        assert prompt[pos] in out.prompt_logprobs[pos]


@pytest.mark.parametrize(
    "prompt, params, words",
    [
        ([], SamplingParams(), "empty"),
        ([1, 10**6], SamplingParams(), "outside the vocabulary"),
        ([1, 2], SamplingParams(max_tokens=200), "exceeds max_model_len"),
        ([1] * 130, SamplingParams(max_tokens=1), "max_model_len"),
        ([1, 2], SamplingParams(logit_bias={10**6: 1.0}), "logit_bias"),
        ([1, 2], SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
        ([1, 2], SamplingParams(n=1000), "n"),
        ([1, 2], SamplingParams(stop=[f"s{i}" for i in range(40)]), "stop"),
    ],
)
def test_invalid_requests_are_refused_and_nothing_is_queued(tiny_llm, prompt, params, words):
    engine: LLMEngine = tiny_llm.engine
    with pytest.raises(ValueError, match=words):
        engine.add_request("bad", prompt, params)
    assert not engine.has_unfinished_requests()


def test_prompt_plus_max_tokens_error_states_the_arithmetic(tiny_llm):
    with pytest.raises(ValueError) as e:
        tiny_llm.generate([[1] * 100], SamplingParams(max_tokens=50), use_tqdm=False)
    assert "100" in str(e.value) and "50" in str(e.value) and "150" in str(e.value)
    assert "128" in str(e.value)


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny_llm, monkeypatch):
    engine = tiny_llm.engine
    run = engine.executor.execute
    failures = [RuntimeError("kernel exploded")]

    def flaky(scheduled):
        if failures:
            raise failures.pop()
        return run(scheduled)

    monkeypatch.setattr(engine.executor, "execute", flaky)
    engine.add_request("doomed", [1, 5, 6], greedy(4))
    (out,) = engine.step()
    assert out.finished and out.error == "RuntimeError: kernel exploded"
    assert [c.finish_reason for c in out.outputs] == ["error"]
    assert not engine.has_unfinished_requests() and engine.stats().num_running == 0
    fine = tiny_llm.generate([[1, 5, 6]], greedy(4), use_tqdm=False)[0].outputs[0]
    assert len(fine.token_ids) == 4 and fine.finish_reason == "length"


def test_the_engine_describes_its_model_once(tiny_llm):
    info = tiny_llm.engine.model_info
    assert info.name == "-".join(info.display_name.lower().split()) and info.name
    assert info.max_model_len == 128 and info.vocab_size == tiny_llm.engine.model_config.vocab_size
    assert info.fingerprint.startswith("fp_") and len(info.fingerprint) == 13
