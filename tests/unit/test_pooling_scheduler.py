"""Embedding requests in the scheduler, driven without a model (test_scheduler.py's
CheckedScheduler checks every record against a device side's copy): chunked like any prompt,
no logits rows, no speculative drafts even for a last one-token chunk, ended and freed by the
step that returns the embedding, and no prefix-cache lookup for mean pooling."""

from __future__ import annotations

import itertools

from test_scheduler import CheckedScheduler

from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence
from inferd.engine.scheduling.speculative import Speculation
from inferd.engine.scheduling.step import ModelRunnerOutput
from inferd.outputs import RequestMetrics
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams
from inferd.spec_decode import SpeculativeConfig

BS = 4
_ids = itertools.count()


def make(budget: int):
    kv = KVCacheManager([None], [64], BS, True)
    spec = Speculation(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=2,
                                         prompt_lookup_min=1), 256, adaptive=False)  # fmt: skip
    return kv, CheckedScheduler(kv, 8, budget, 256, (), b"root", spec)


def embed(sched, prompt: list[int], pooling_type: str = "last") -> Request:
    pooling = PoolingParams(pooling_type, True, None)
    # NOTE: max_tokens 8, not the engine's 0: room for drafts, so only the pooling keeps them off
    req = Request(f"e{next(_ids)}", list(prompt), SamplingParams(), RequestMetrics(0.0), 8,
                  forked=True, pooling=pooling)  # fmt: skip
    req.sequences = [Sequence(next(_ids), req, 0, list(prompt), len(prompt))]
    sched.add_request(req)
    return req


def finish_step(sched, vector=(1.0,)):
    """One step; the runner's output: an embedding for each pooling row that ends its prompt."""
    record = sched.schedule()
    done = {
        r.seq_id: list(vector)
        for r in record.rows
        if r.num_computed + r.num_new_tokens == sched.sequences[r.seq_id].num_prompt_tokens
    }
    return record, sched.update_from_output(record, ModelRunnerOutput([], embeddings=done))


def test_chunked_without_logits_or_drafts_and_freed_when_done():
    kv, sched = make(budget=4)
    # A repetitive prompt n-gram lookup would draft for; its last chunk is one token.
    req = embed(sched, [5, 6, 5, 6, 5, 6, 5, 6, 5])
    outputs = []
    for _ in range(3):
        record, out = finish_step(sched, vector=(0.5, 0.5))
        outputs += out
        (row,) = record.rows
        assert not row.needs_logits and not row.draft_token_ids
    assert len(outputs) == 1 and outputs[0].finished and outputs[0].embedding == [0.5, 0.5]
    assert outputs[0].samples[0].finish_reason == "stop"
    assert req.request_id not in sched.requests and kv.usage == 0.0
    assert not sched.has_unfinished_requests()


def test_mean_pooling_never_starts_from_a_cached_prefix():
    kv, sched = make(budget=64)
    prompt = list(range(10, 23))
    embed(sched, prompt, "last")
    finish_step(sched)
    again = embed(sched, prompt, "last")
    record, _ = finish_step(sched)
    assert record.rows[0].num_computed == 12  # three cached blocks; the last token computed
    assert again.metrics.num_cached_tokens == 12
    mean = embed(sched, prompt, "mean")
    record, _ = finish_step(sched)
    assert record.rows[0].num_computed == 0 and mean.metrics.num_cached_tokens == 0
