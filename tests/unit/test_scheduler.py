"""The scheduler and the KV-cache manager driven with fabricated runner outputs (the sampled token
ids a model would return): no model, milliseconds. Each test runs steps exactly as the engine
core does, `schedule()` → (fake execution of the StepRecord) → `update_from_output()`; every
record is also applied to a DeviceSequences, whose tokens and tables must equal the scheduler's."""

from __future__ import annotations

import itertools

import pytest

from inferd.engine.execution.device_state import DeviceSequences
from inferd.engine.scheduling.kv_cache import NULL_BLOCK, KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence, SequenceStatus
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine.scheduling.step import ModelRunnerOutput, StepRecord
from inferd.outputs import Logprob, RequestMetrics
from inferd.sampling_params import SamplingParams

BS = 4
ROOT = b"test-root"
EOS = 1
_ids = itertools.count()


def make_request(prompt: list[int], max_tokens: int = 4, n: int = 1, **params) -> Request:
    params.setdefault("ignore_eos", True)
    sp = SamplingParams(max_tokens=max_tokens, n=n, **params)
    req = Request(f"r{next(_ids)}", list(prompt), sp, RequestMetrics(0.0), max_tokens,
                  forked=n == 1)  # fmt: skip
    samples = [Sequence(next(_ids), req, i, list(prompt), len(prompt)) for i in range(n)]
    req.sequences, req.forks = samples[:1], samples[1:]
    return req


class CheckedScheduler(Scheduler):
    """A scheduler whose every record is applied to a device side's DeviceSequences, as the
    runner applies it: the tokens and block tables sent as deltas must add up to its own."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.device = DeviceSequences(len(self.kv.pools))

    def schedule(self) -> StepRecord:
        record = super().schedule()
        if record.rows:
            self.device.apply(record)
            for row, step in zip(record.rows, self.device.forward_rows(record), strict=True):
                seq = self.sequences[row.seq_id]
                assert self.device[row.seq_id].token_ids == seq.token_ids
                assert step.block_tables == [list(t) for t in seq.block_tables]
                assert step.token_ids == (seq.token_ids[row.num_computed :][: row.num_new_tokens]
                                          + row.draft_token_ids)  # fmt: skip
        return record

    def seq(self, row) -> Sequence:
        return self.sequences[row.seq_id]


def make(num_blocks=64, windows=(None,), budget=32, max_seqs=8, caching=True, max_model_len=256):
    kv = KVCacheManager(list(windows), [num_blocks] * len(windows), BS, caching)
    return kv, CheckedScheduler(kv, max_seqs, budget, max_model_len, (EOS,), ROOT)


def add(sched: Scheduler, *args, **kw) -> Sequence:
    req = make_request(*args, **kw)
    sched.add_request(req)
    return req.sequences[0]


def fake_output(out: StepRecord, token: int = 7) -> ModelRunnerOutput:
    """What the runner and sampler would return: one token per sampled sequence."""
    return ModelRunnerOutput([[token] for _ in out.sample_ids])


def run_step(sched: Scheduler, token: int = 7) -> tuple[StepRecord, list]:
    out = sched.schedule()
    return out, sched.update_from_output(out, fake_output(out, token))


def run_all(sched: Scheduler, limit: int = 1000) -> list[str]:
    """Ids of the requests that finished, in finishing order."""
    finished = []
    for _ in range(limit):
        if not sched.has_unfinished_requests():
            return finished
        finished += [o.request_id for o in run_step(sched)[1] if o.finished]
    raise AssertionError("requests did not finish")


def free_blocks(kv: KVCacheManager) -> list[int]:
    return [p.num_free for p in kv.pools]


# ---- what runs ----------------------------------------------------------------------------------
def test_budget_is_respected_and_long_prompt_is_chunked():
    kv, sched = make(budget=32)
    long = add(sched, list(range(100)))
    chunks = []
    while long.num_output_tokens == 0:
        out, _ = run_step(sched)
        assert out.num_tokens <= 32
        chunks.append(out.num_tokens)
    assert chunks == [32, 32, 32, 4]
    assert long.num_computed == 100 and long.output_token_ids == [7]


def test_decodes_are_scheduled_before_new_prefills():
    kv, sched = make(budget=8)
    a, b = add(sched, [1, 2, 3], max_tokens=10), add(sched, [4, 5, 6], max_tokens=10)
    run_step(sched)  # both prefill (6 tokens)
    newcomer = add(sched, list(range(50, 70)))
    out = sched.schedule()
    first_two = [sched.seq(r) for r in out.rows[:2]]
    assert first_two == [a, b] and all(r.num_new_tokens == 1 for r in out.rows[:2])
    assert sched.seq(out.rows[2]) is newcomer and out.rows[2].num_new_tokens == 6
    assert out.num_tokens == 8
    # The newcomer's prompt travels once, whole; the step computes its first 6 tokens.
    (new,) = out.new_sequences
    assert new.seq_id == newcomer.seq_id and new.prompt_token_ids == list(range(50, 70))
    assert sched.device.forward_rows(out)[2].token_ids == list(range(50, 56))
    assert not out.rows[2].needs_logits
    # The decodes send only the token they gained.
    assert [r.new_token_ids for r in out.rows[:2]] == [[7], [7]]


def test_budget_never_exceeded_under_many_requests():
    kv, sched = make(budget=16, max_seqs=4)
    seqs = [add(sched, list(range(i, i + 9)), max_tokens=5) for i in range(10)]
    finished: list[str] = []
    for _ in range(500):
        if not sched.has_unfinished_requests():
            break
        out, reported = run_step(sched)
        finished += [o.request_id for o in reported if o.finished]
        assert out.num_tokens <= 16
        assert len(sched.running) <= 4
    assert sorted(finished) == sorted(s.request.request_id for s in seqs)
    assert all(s.output_token_ids == [7] * 5 and s.finish_reason == "length" for s in seqs)


def test_preemption_under_tiny_pool_finishes_every_request():
    # 13 usable blocks of 4 tokens; each request needs up to 4 blocks (12 prompt + 4 output).
    kv, sched = make(num_blocks=14, budget=64, max_seqs=8)
    start = free_blocks(kv)
    seqs = [add(sched, [100 + i] * 12, max_tokens=4) for i in range(6)]
    finished = run_all(sched)
    assert sorted(finished) == sorted(s.request.request_id for s in seqs)
    assert sched.counters.num_preemptions > 0
    assert sum(s.request.metrics.num_preemptions for s in seqs) == sched.counters.num_preemptions
    assert all(s.num_output_tokens == 4 for s in seqs)
    assert free_blocks(kv) == start


def test_newest_running_sequence_is_the_one_preempted():
    kv, sched = make(num_blocks=7, budget=64, max_seqs=8)  # 6 usable blocks
    old, new = add(sched, [1] * 12, max_tokens=8), add(sched, [2] * 12, max_tokens=8)
    run_step(sched)  # 3 blocks each: pool full
    out, _ = run_step(sched)  # `old` needs a 4th block for token 12
    assert out.preempted_seq_ids == [new.seq_id]
    assert new.status is SequenceStatus.WAITING and new.num_computed == 0
    assert sched.waiting[0] is new and old in sched.running
    assert new.output_token_ids == [7]  # kept: recomputed as part of its prompt later


# ---- KV blocks and the prefix cache -------------------------------------------------------------
def test_shared_prefix_blocks_return_to_zero_references():
    kv, sched = make(num_blocks=32)
    prefix = list(range(40, 52))  # 3 full blocks
    a = add(sched, prefix + [1, 2], max_tokens=5)
    run_step(sched)
    b = add(sched, prefix + [9, 9, 9], max_tokens=2)
    out, _ = run_step(sched)
    step_b = next(r for r in out.rows if sched.seq(r) is b)
    assert step_b.num_new_tokens == 3 and step_b.num_computed == 12  # 12 came from the cache
    shared = a.block_tables[0][:3]
    assert b.block_tables[0][:3] == shared
    assert all(kv.pools[0].ref[blk] == 2 for blk in shared)
    assert sched.counters.prefix_cache_hits == 12 and b.request.metrics.num_cached_tokens == 12
    run_all(sched)
    assert all(kv.pools[0].ref[blk] == 0 for blk in range(1, 32))


def test_every_block_is_cleared_once_before_its_first_use():
    kv, sched = make(num_blocks=32, budget=8)
    for i in range(3):
        add(sched, [10 + i] * 9, max_tokens=6)
    held, cleared = set(), []
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        cleared += out.blocks_to_clear[0]
        for r in out.rows:
            held |= {b for b in sched.device[r.seq_id].block_tables[0] if b != NULL_BLOCK}
    assert sorted(cleared) == sorted(set(cleared)) and held <= set(cleared)


def test_aborts_return_every_block():
    kv, sched = make(num_blocks=40)
    start = free_blocks(kv)
    seqs = [add(sched, list(range(i, i + 10)), max_tokens=20) for i in range(5)]
    for _ in range(3):
        run_step(sched)
    for s in seqs:
        out = sched.abort_request(s.request.request_id)
        assert out.request_id == s.request.request_id and out.finished
        assert s.request.finished and s.finish_reason == "abort"
        assert [(d.index, d.finish_reason) for d in out.samples] == [(0, "abort")]
    assert sched.abort_request(seqs[0].request.request_id) is None  # already gone
    assert not sched.has_unfinished_requests() and not sched.running and not sched.waiting
    assert free_blocks(kv) == start


def test_cached_free_blocks_survive_until_uncached_ones_are_used():
    kv, sched = make(num_blocks=9)  # 8 usable blocks
    add(sched, list(range(8)) + [99], max_tokens=1)  # 2 full blocks + 1 partial
    run_all(sched)
    pool = kv.pools[0]
    kept = dict(pool.cached)
    assert len(kept) == 2 and pool.num_free == 8
    add(sched, list(range(200, 221)), max_tokens=1)  # 21 tokens: the 6 uncached blocks
    run_step(sched)
    assert all(pool.cached.get(h) == blk for h, blk in kept.items())
    newer = {h: blk for h, blk in pool.cached.items() if h not in kept}  # b's, freed later
    # 3 blocks: b's uncached partial block, then the two least recently freed cached ones.
    add(sched, list(range(300, 310)), max_tokens=1)
    run_step(sched)
    assert not any(pool.cached.get(h) == blk for h, blk in kept.items())
    assert all(pool.cached.get(h) == blk for h, blk in newer.items())


def test_sliding_group_drops_blocks_outside_the_window():
    window = 8
    kv, sched = make(num_blocks=64, windows=(None, window), budget=8)
    seq = add(sched, list(range(40)), max_tokens=3)
    while sched.has_unfinished_requests():
        run_step(sched)
        if seq.block_tables:
            live = [b for b in seq.block_tables[1] if b != NULL_BLOCK]
            # window (8) behind the step's first token + the step's 8 tokens, whole blocks
            assert len(live) <= (window - 1 + 8) // BS + 2
            assert NULL_BLOCK not in seq.block_tables[0]
    assert seq.is_finished and seq.num_output_tokens == 3


def test_prefix_hit_with_sliding_group_needs_only_the_window():
    window = 8
    kv, sched = make(num_blocks=64, windows=(None, window), budget=64)
    prompt = list(range(30))
    add(sched, prompt + [1], max_tokens=1)
    run_step(sched)
    b = make_request(prompt + [2, 3], max_tokens=1)
    sched.add_request(b)  # hashes its blocks
    cached, tables = kv.find_cached_prefix(b.sequences[0])
    assert cached == 28  # 7 full blocks of the shared 30 tokens
    first_needed = (28 - window + 1) // BS
    assert tables[1][:first_needed] == [NULL_BLOCK] * first_needed
    assert NULL_BLOCK not in tables[0]


# ---- what came of a step ------------------------------------------------------------------------
def test_stops_finish_the_sequence_and_free_its_blocks():
    kv, sched = make()
    start = free_blocks(kv)
    eos = add(sched, [5, 6, 7], max_tokens=10, ignore_eos=False)
    stop_id = add(sched, [5, 6, 8], max_tokens=10, stop_token_ids=[42])
    out = sched.schedule()
    tokens = {eos.seq_id: [EOS], stop_id.seq_id: [42]}
    reported = sched.update_from_output(
        out, ModelRunnerOutput([tokens[seq_id] for seq_id in out.sample_ids])
    )
    assert {r.request_id for r in reported} == {eos.request.request_id, stop_id.request.request_id}
    assert (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert (stop_id.finish_reason, stop_id.stop_reason) == ("stop", 42)
    assert all(r.finished for r in reported)
    assert all(s.request.metrics.finished_time is not None for s in (eos, stop_id))
    deltas = {r.request_id: r.samples[0] for r in reported}
    assert deltas[stop_id.request.request_id].finish_reason == "stop"
    assert deltas[stop_id.request.request_id].stop_reason == 42
    assert not sched.has_unfinished_requests() and free_blocks(kv) == start


def test_each_step_reports_only_the_news_of_each_request():
    # Whether a caller hears of a request before it finishes is the front end's business
    # (test_output_processor.py): the core reports every step's new tokens, once each.
    kv, sched = make()
    a, b = add(sched, [3, 4], max_tokens=3), add(sched, [3, 5], max_tokens=3)
    reports = [run_step(sched, token=10 + i)[1] for i in range(3)]
    seen = [[(o.request_id, o.samples[0].new_token_ids, o.finished) for o in rep]
            for rep in reports]  # fmt: skip
    ids = a.request.request_id, b.request.request_id
    assert seen == [[(rid, [10 + i], i == 2) for rid in ids] for i in range(3)]
    assert reports[2][0].samples[0].finish_reason == "length"


def test_tokens_after_a_stop_in_one_step_are_dropped():
    # A step may return several tokens for a sequence (speculative decoding): the first stop
    # ends it there.
    kv, sched = make()
    seq = add(sched, [5, 6], max_tokens=10, ignore_eos=False)
    out = sched.schedule()
    (report,) = sched.update_from_output(out, ModelRunnerOutput([[9, EOS, 8]]))
    assert seq.output_token_ids == [9, EOS] and seq.finish_reason == "stop"
    assert sched.counters.generation_tokens == 2
    assert report.samples[0].new_token_ids == [9, EOS] and report.finished


def test_counters_and_timestamps():
    kv, sched = make(budget=8)
    seq = add(sched, list(range(10, 22)), max_tokens=3)  # 12 tokens: chunks of 8 and 4
    run_all(sched)
    c, m = sched.counters, seq.request.metrics
    assert (c.prompt_tokens_computed, c.generation_tokens, c.steps) == (12, 3, 4)
    assert (c.prefix_cache_queries, c.prefix_cache_hits) == (12, 0)
    assert m.num_generation_tokens == 3
    assert m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    stats = sched.stats()
    assert (stats.prompt_tokens, stats.generation_tokens, stats.steps) == (12, 3, 4)


def test_a_runner_output_of_the_wrong_size_is_refused():
    kv, sched = make()
    add(sched, [1, 2, 3])
    out = sched.schedule()
    with pytest.raises(ValueError, match="sampled 2 sequences, but 1"):
        sched.update_from_output(out, ModelRunnerOutput([[7], [7]]))


def test_prompt_logprobs_come_from_the_runner_and_skip_the_prefix_cache():
    kv, sched = make(budget=4)
    prompt = list(range(20, 28))
    add(sched, prompt, max_tokens=1)
    run_all(sched)  # its blocks are cached now
    seq = add(sched, prompt, max_tokens=1, prompt_logprobs=1)
    req = seq.request
    prompt_logprobs = [None]  # what the front end collects from the reports
    while not req.finished:
        out = sched.schedule()
        (s,) = out.rows
        assert s.prompt_logprobs and s.num_computed == len(prompt_logprobs) - 1
        # Position p predicts prompt token p + 1; the last prompt position predicts none.
        targets = prompt[s.num_computed + 1 : s.num_computed + s.num_new_tokens + 1]
        entries = [{t: Logprob(-1.0, 1)} for t in targets]
        reports = sched.update_from_output(
            out, ModelRunnerOutput([[7]] * len(out.sample_ids), [], {seq.seq_id: entries})
        )
        for report in reports:
            prompt_logprobs += report.new_prompt_logprobs or []
    assert len(prompt_logprobs) == len(prompt) and req.metrics.num_cached_tokens == 0
    assert [e.token_ids[0] for e in prompt_logprobs[1:]] == prompt[1:]


# ---- n > 1 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("partial", [True, False])
def test_fork_shares_full_blocks_and_copies_the_partial_one(partial):
    kv, sched = make(num_blocks=32)
    prompt = list(range(10 if partial else 12))
    parent = add(sched, prompt, max_tokens=4, n=2, temperature=1.0)
    req = parent.request
    (child,) = req.forks
    out = sched.schedule()
    assert out.rows[0].fork_seq_ids == [child.seq_id]
    assert out.sample_ids == [parent.seq_id, child.seq_id]
    # The fork is introduced with the step it first draws in, without its prompt (the parent's).
    assert [(n.seq_id, n.fork_of, n.prompt_token_ids) for n in out.new_sequences][1:] == [
        (child.seq_id, parent.seq_id, [])
    ]
    sched.update_from_output(out, ModelRunnerOutput([[7], [8]]))
    assert req.sequences == [parent, child] and req.forked and not req.forks
    assert parent.output_token_ids == [7] and child.output_token_ids == [8]
    full = len(prompt) // BS
    assert child.block_tables[0][:full] == parent.block_tables[0][:full]
    assert child in sched.running and child.num_computed == len(prompt)
    out = sched.schedule()  # the copy is made before the step that writes into the blocks
    if partial:
        assert out.block_copies == [(0, parent.block_tables[0][-1], child.block_tables[0][-1])]
        assert child.block_tables[0][-1] != parent.block_tables[0][-1]
        assert child.block_tables[0][-1] in out.blocks_to_clear[0]  # zeroed, then copied
    else:
        assert out.block_copies == []
    assert [sched.seq(r) for r in out.rows] == [parent, child]


def test_fork_without_a_running_slot_waits_and_recomputes():
    kv, sched = make(num_blocks=32, max_seqs=1)
    parent = add(sched, list(range(10)), max_tokens=2, n=2, temperature=1.0)
    (child,) = parent.request.forks
    out, _ = run_step(sched)
    assert child.status is SequenceStatus.WAITING and child.num_computed == 0
    assert child.output_token_ids == [7] and not child.block_tables
    assert sched.schedule().block_copies == []
    finished = run_all(sched)
    assert finished == [parent.request.request_id] and child.output_token_ids == [7, 7]


# ---- failures -----------------------------------------------------------------------------------
def test_a_failed_step_fails_its_requests_and_keeps_the_device_work():
    kv, sched = make(num_blocks=32)
    start = free_blocks(kv)
    parent = add(sched, list(range(10)), max_tokens=4, n=2, temperature=1.0)
    run_step(sched)  # forks: a block copy is due before the next step
    out = sched.schedule()
    assert out.block_copies
    bystander = add(sched, [9, 9, 9])
    failed = sched.fail_step(out, RuntimeError("kernel exploded"))
    assert [f.request_id for f in failed] == [parent.request.request_id]
    assert parent.request.finished and failed[0].finished
    assert parent.request.error == failed[0].error == "RuntimeError: kernel exploded"
    assert {s.finish_reason for s in parent.request.sequences} == {"error"}
    retry = sched.schedule()
    assert retry.block_copies == out.block_copies
    assert set(out.blocks_to_clear[0]) <= set(retry.blocks_to_clear[0])
    sched.update_from_output(retry, fake_output(retry))
    assert run_all(sched) == [bystander.request.request_id]
    assert free_blocks(kv) == start
    # The failed sequences are forgotten on the device side by a later record.
    assert all(s.seq_id not in sched.device.sequences for s in parent.request.sequences)
