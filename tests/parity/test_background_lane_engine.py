"""The background lane in a whole engine (a tiny random GGUF model in the default dtype, token ids
in and out, the default fcfs policy): a background request whose prompt is computed a few tokens
a step, paused while interactive prompts are computed, gives exactly the greedy tokens it gets
alone, and so do the interactive requests it was interleaved with."""

from __future__ import annotations

import random

import pytest
from tiny_gguf import VOCAB, tiny_llama_llm

from inferd import SamplingParams
from inferd.engine.scheduling.background_lane import BACKGROUND_PREFILL_TOKENS

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with tiny_llama_llm(tmp_path_factory.mktemp("tiny"), kv_cache_memory=16 << 20,
                        max_num_seqs=4) as llm:  # fmt: skip
        yield llm


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(30, 45))] for _ in range(n)]


def test_a_background_request_keeps_its_greedy_tokens_among_interactive_ones(llm):
    engine = llm.engine
    prompts = _prompts(4)
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    engine.core.kv.reset_prefix_cache()  # the run below computes, as it would the first time
    engine.add_request("bg-0", {"prompt_token_ids": prompts[0], "background": True}, GREEDY)
    engine.add_request("bg-1", {"prompt_token_ids": prompts[1], "background": True}, GREEDY)
    finals, bg_prompt_steps = {}, 0
    for step in range(60):
        if step in (1, 3):  # interactive arrivals while a background prompt is half computed
            i = 2 if step == 1 else 3
            engine.add_request(f"fg-{i}", {"prompt_token_ids": prompts[i]}, GREEDY)
        if not engine.has_unfinished_requests():
            break
        bg = engine.core.scheduler.requests.get("bg-0")
        if bg is not None and not bg.sequences[0].prefill_done:
            bg_prompt_steps += 1
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    # Its prompt took a few tokens a step, and waited out the interactive prompts' steps.
    assert bg_prompt_steps > len(prompts[0]) // BACKGROUND_PREFILL_TOKENS
    tokens = [finals[r].outputs[0].token_ids for r in ("bg-0", "bg-1", "fg-2", "fg-3")]
    assert tokens == alone


def test_background_must_be_a_boolean(llm):
    with pytest.raises(ValueError, match="background must be true or false"):
        llm.engine.add_request("bad", {"prompt_token_ids": [5, 6], "background": 1}, GREEDY)
