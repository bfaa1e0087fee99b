"""Structured outputs in an engine with speculative decoding, on a tiny random model: sequences
under a grammar get no drafts (engine/scheduling/speculative.py) even when the n-gram lookup has
some, while free sequences in the same steps verify theirs; every constrained reply still matches
its grammar, and is the reply the engine gives without speculation."""

from __future__ import annotations

import re

import pytest
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.spec_decode.ngram import NgramIndex

REGEX = "[0-9]{3}-[a-z]{2}"
CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
          "prompt_lookup_min": 1}  # fmt: skip


@pytest.fixture(scope="module")
def spec_llm(tmp_path_factory):
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama")
    llm = LLM(model=str(folder), dtype="float32", kv_cache_memory=16 << 20, max_model_len=128,
              speculative_config=CONFIG)  # fmt: skip
    llm.engine.speculation.adaptive = False  # verify whatever the lookup finds
    yield llm
    llm.shutdown()


def test_constrained_sequences_get_no_drafts_and_keep_their_grammar(spec_llm):
    engine = spec_llm.engine
    tok = spec_llm.get_tokenizer()
    # Every token the regex's replies can be made of is in the prompt, so the 1-gram lookup
    # finds a draft at every constrained decode step: only the rule keeps drafts off them.
    alphabet = [i for i in range(engine.model_config.vocab_size)
                if re.fullmatch(r"[0-9a-z-]+", tok.decode([i]))]  # fmt: skip
    prompt = alphabet
    seen = {"constrained decodes": 0, "with a lookup": 0, "free drafts": 0}
    schedule = engine.scheduler.schedule

    def watched():
        out = schedule()
        for s in out.rows:
            seq = engine.scheduler.sequences[s.seq_id]
            if seq.matcher is None:
                seen["free drafts"] += len(s.draft_token_ids)
                continue
            assert seq.request.params.structured_outputs is not None
            assert s.draft_token_ids == [], "a constrained sequence got drafts"
            assert not s.needs_logits or s.seq_id in out.grammar_bitmasks
            if seq.num_output_tokens:
                index = NgramIndex(1, 2)
                index.sync(seq.token_ids)
                seen["constrained decodes"] += 1
                seen["with a lookup"] += bool(index.lookup(seq.token_ids, 3))
        return out

    constrained = [
        SamplingParams(temperature=0, max_tokens=24, structured_outputs={"regex": REGEX}),
        SamplingParams(temperature=1.0, seed=3, max_tokens=24, structured_outputs={"regex": REGEX}),
    ]
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.scheduler.schedule = watched
    try:
        outs = spec_llm.generate([prompt] * 3, [*constrained, free], use_tqdm=False)
    finally:
        engine.scheduler.schedule = schedule
    for out in outs[:2]:
        assert out.outputs[0].finish_reason == "stop"
        assert re.fullmatch(REGEX, out.outputs[0].text), out.outputs[0].text
    assert seen["free drafts"] > 0  # drafted rows shared the sampling rounds with constrained ones
    assert seen["constrained decodes"] >= 8
    assert seen["with a lookup"] == seen["constrained decodes"]
    # The same replies without speculation: the constrained rows were sampled as in plain decoding.
    speculation, engine.scheduler.speculation = engine.scheduler.speculation, None
    try:
        plain = spec_llm.generate([prompt] * 3, [*constrained, free], use_tqdm=False)
    finally:
        engine.scheduler.speculation = speculation
    assert [o.outputs[0].token_ids for o in plain] == [o.outputs[0].token_ids for o in outs]
