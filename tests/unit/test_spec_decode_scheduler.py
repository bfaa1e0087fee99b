"""Speculative decoding in the scheduler and the KV-cache manager, driven by a fake model (a
fixed function of the context) instead of a runner: drafts in the budget, rejected slots given
back, hashes of accepted tokens only, stops inside a draft, no blocks for drafts, aborts, and
token-for-token the output of plain decoding through preemption. No model, milliseconds. Every
record is checked against a device side's copy (test_scheduler.py's CheckedScheduler)."""

from __future__ import annotations

import itertools

from test_scheduler import CheckedScheduler

from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence, block_hash
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine.scheduling.speculative import Speculation
from inferd.engine.scheduling.step import ModelRunnerOutput, StepRecord
from inferd.outputs import RequestMetrics
from inferd.sampling_params import SamplingParams
from inferd.spec_decode import SpeculativeConfig

BS = 4
ROOT = b"spec-root"
CONFIG = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=2, prompt_lookup_min=1)
_ids = itertools.count()


def make(num_blocks=64, budget=32, max_seqs=8, speculate=True, max_model_len=256, windows=(None,)):
    kv = KVCacheManager(list(windows), [num_blocks] * len(windows), BS, True)
    spec = Speculation(CONFIG, max_model_len, adaptive=False) if speculate else None
    return kv, CheckedScheduler(kv, max_seqs, budget, max_model_len, (), ROOT, spec)


def add(sched: Scheduler, prompt: list[int], max_tokens: int = 8, **params) -> Sequence:
    params.setdefault("ignore_eos", True)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, **params)
    req = Request(f"r{next(_ids)}", list(prompt), sp, RequestMetrics(0.0), max_tokens,
                  forked=True)  # fmt: skip
    req.sequences = [Sequence(next(_ids), req, 0, list(prompt), len(prompt))]
    sched.add_request(req)
    return req.sequences[0]


def model(context: list[int]) -> int:
    """A fake greedy model: repeats what came three tokens back, except every fifth position,
    where it writes something new; so lookups are right often, not always."""
    if len(context) % 5 == 0 or len(context) < 3:
        return (sum(context[-2:]) * 7 + len(context)) % 40 + 10
    return context[-3]


def verify(sched: CheckedScheduler, out: StepRecord, accept=None) -> ModelRunnerOutput:
    """What the runner and sampler return: row j of a sequence is `model` after its tokens and
    drafts[:j]; drafts are kept while they agree. `accept` forces how many are kept instead."""
    tokens = []
    for s in out.rows:
        for seq_id in s.sample_ids:
            tokens_so_far = sched.device[seq_id].token_ids  # what the device side was sent
            drafts = s.draft_token_ids
            rows = [model(tokens_so_far + drafts[:j]) for j in range(len(drafts) + 1)]
            kept = 0
            while kept < len(drafts) and drafts[kept] == rows[kept]:
                kept += 1
            if accept is not None:
                kept = min(accept, len(drafts))
                rows[kept] = 99 if kept < len(drafts) else rows[kept]  # a token no draft has
            tokens.append(list(drafts[:kept]) + [rows[kept]])
    return ModelRunnerOutput(tokens)


def step(sched: Scheduler, accept=None) -> StepRecord:
    out = sched.schedule()
    sched.update_from_output(out, verify(sched, out, accept))
    return out


def run_all(sched: Scheduler) -> None:
    for _ in range(1000):
        if not sched.has_unfinished_requests():
            return
        step(sched)
    raise AssertionError("requests did not finish")


def held(kv: KVCacheManager) -> int:
    return sum(p.num_blocks - 1 - p.num_free for p in kv.pools)


PERIODIC = [5, 6, 7, 5, 6, 7]  # the model continues it with 5, 6, 7, 5, then something new


def test_drafts_take_budget_and_rows_after_the_last_token():
    kv, sched = make()
    seq = add(sched, PERIODIC)
    step(sched)  # prefill; the model writes 5
    out = sched.schedule()
    (s,) = out.rows
    assert s.draft_token_ids == [6, 7, 5, 6]
    (row,) = sched.device.forward_rows(out)
    assert row.token_ids == [5, 6, 7, 5, 6] and s.num_computed == 6 and out.num_tokens == 5
    assert row.verify and s.new_token_ids == [5]
    sched.update_from_output(out, verify(sched, out))
    assert seq.output_token_ids[:4] == [5, 6, 7, 5] and seq.num_output_tokens == 5  # 3 kept
    assert seq.num_computed == seq.num_tokens - 1  # the last emitted token is not computed yet
    assert sched.speculation.metrics.counters()["spec_decode_num_accepted_tokens"] == 3


def test_rejected_drafts_give_their_blocks_back_and_accepted_ones_keep_theirs():
    kv, sched = make()
    seq = add(sched, PERIODIC)
    step(sched)  # 7 tokens, 6 computed, two blocks
    assert held(kv) == 2
    out = sched.schedule()
    assert len(out.rows[0].draft_token_ids) == 4 and held(kv) == 3  # positions 6..10
    sched.update_from_output(out, verify(sched, out, accept=0))
    assert (seq.num_tokens, seq.num_computed) == (8, 7) and held(kv) == 2  # block 2 went back

    kv, sched = make()
    seq = add(sched, PERIODIC)
    step(sched)
    step(sched, accept=4)
    assert (seq.num_tokens, seq.num_computed) == (12, 11) and held(kv) == 3


def test_prefix_cache_hashes_cover_accepted_tokens_only():
    kv, sched = make()
    seq = add(sched, PERIODIC, max_tokens=20)
    step(sched)
    out = step(sched, accept=1)  # keeps the first draft, rejects the second: 99 instead
    rejected_draft = out.rows[0].draft_token_ids[1]
    for _ in range(6):
        step(sched)
    chain, expected = ROOT, []
    for i in range(seq.num_tokens // BS):
        chain = block_hash(chain, seq.token_ids[i * BS : (i + 1) * BS])
        expected.append(chain)
    assert seq.block_hashes == expected
    registered = set(kv.pools[0].cached)
    assert registered == set(expected[: seq.num_computed // BS])
    # A prompt of the same tokens finds them; one with a rejected draft in their place does not.
    cached = seq.num_computed // BS * BS
    assert cached > seq.token_ids.index(99)
    assert kv.find_cached_prefix(add(sched, seq.token_ids[:cached] + [1]))[0] == cached
    rejected = list(seq.token_ids[:cached])
    rejected[seq.token_ids.index(99)] = rejected_draft
    assert kv.find_cached_prefix(add(sched, rejected + [1]))[0] < cached


def test_max_tokens_bounds_the_drafts_and_a_stop_inside_a_draft_ends_there():
    kv, sched = make()
    seq = add(sched, PERIODIC, max_tokens=3)
    step(sched)
    out = step(sched)
    assert len(out.rows[0].draft_token_ids) == 1  # 2 outputs left: one draft + its bonus
    assert seq.output_token_ids == [5, 6, 7] and seq.finish_reason == "length"
    assert held(kv) == 0

    stop = add(sched, PERIODIC, max_tokens=20, stop_token_ids=[7])
    step(sched)  # the model writes 5
    out = step(sched)  # drafts 6, 7, 5, 6, all accepted: 7 is the stop token
    assert out.rows[0].draft_token_ids == [6, 7, 5, 6]
    assert stop.output_token_ids == [5, 6, 7] and stop.finish_reason == "stop"
    assert held(kv) == 0 and len(sched.speculation.proposer) == 0


def test_no_blocks_for_drafts_decodes_plainly_before_preempting_anyone():
    kv, sched = make(num_blocks=4)  # 3 usable blocks
    a = add(sched, PERIODIC, max_tokens=4)  # 2 blocks, drafts would need a third
    b = add(sched, [7, 8, 7])  # 1 block
    step(sched)
    assert sched.speculation.plan([a], 1, 32)  # there are drafts to verify...
    out = sched.schedule()
    assert not out.preempted_seq_ids and all(not s.draft_token_ids for s in out.rows)  # no room
    sched.update_from_output(out, verify(sched, out))
    assert a.num_output_tokens == 2 and b.num_output_tokens == 2


def test_aborting_speculating_requests_frees_every_block_and_all_state():
    kv, sched = make(num_blocks=32)
    seqs = [add(sched, PERIODIC + [i], max_tokens=40) for i in range(4)]
    drafted = 0
    for _ in range(3):
        drafted += sum(len(s.draft_token_ids) for s in step(sched).rows)
    assert drafted and held(kv) > 0
    for seq in seqs:
        sched.abort_request(seq.request.request_id)
    assert held(kv) == 0 and not sched.has_unfinished_requests()
    assert len(sched.speculation.proposer) == 0 and not sched.speculation._estimates


def test_outputs_equal_plain_decoding_through_preemption_and_small_budgets():
    prompts = [[5, 6, 5, 6, 5], [9, 9, 9], [3, 4, 5, 6, 3, 4], list(range(10, 30)), [7, 8, 7, 8]]

    def outputs(**kw) -> tuple[list[list[int]], Scheduler]:
        kv, sched = make(**kw)
        seqs = [add(sched, p, max_tokens=30 + i) for i, p in enumerate(prompts)]
        run_all(sched)
        assert held(kv) == 0
        return [s.output_token_ids for s in seqs], sched

    reference, _ = outputs(speculate=False)
    assert reference == outputs(speculate=True)[0]
    tight, sched = outputs(speculate=True, num_blocks=14, budget=9)
    assert tight == reference
    assert sched.stats().num_preemptions > 0 and sched.speculation.metrics.num_accepted_tokens > 0
    # Sliding-window groups drop blocks behind the window: drafts and releases respect that.
    windowed, _ = outputs(speculate=True, windows=(None, 6), num_blocks=24, budget=12)
    assert windowed == reference
