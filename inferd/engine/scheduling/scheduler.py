"""The token-budget scheduler: continuous batching, chunked prefill, prefix reuse, preemption;
and the owner of every request's state.

Every step hands out at most `max_num_batched_tokens` tokens:

1. running sequences first, decodes (one token each) before unfinished prefills, oldest first;
2. then waiting sequences in the queue's order (engine/scheduling/waiting_queue.py: arrival, or
   priority then arrival; the queue head is never skipped, but for the background lane's
   requests, which also compute their prompts last, a few tokens a step: background_lane.py),
   each starting after its longest cached prefix and taking what is left of the budget, so a
   prompt longer than the budget is prefilled in chunks over several steps. Under the priority
   policy a head that finds no seat or no blocks preempts the running sequence of the lowest
   priority, if it is strictly lower.

With `max_queue_time`, a request that has waited that long since its arrival at the server
without ever being scheduled ends before the step ("queue_timeout", its blocks and place
freed); one that ran once, even if preempted since, is never cut by it.

With a KV connector (engine/kv_tiers/connector.py) the blocks of a prompt past the pool's hit
may come from a tier: the first few waiting prompts' blocks are looked up ahead; the queue head
waits for its lookup (the running sequences step meanwhile), then starts after the pool's hit
and the blocks that arrived, which go into fresh blocks before its first step
(`StepRecord.kv_loads`) and count as cached tokens. Every block the scheduler names for the
prefix cache is handed to the connector to keep (`take_saves`).

When a pool cannot give a running sequence its next blocks, the newest running sequence (under
the priority policy: the lowest priority, the newest among equals) is preempted: its blocks are
freed and it goes back to the queue (its head, under fcfs), to be recomputed (cheaply, through
the prefix cache) when memory allows. A step that preempts so admits no one.
Every sequence fits the pool alone (checked at admission), so the oldest one always progresses.

With speculative decoding (engine/scheduling/speculative.py) a decoding sequence may take 1 + k
tokens of the budget: its last token and k drafts to verify; when its blocks cannot hold the drafts
it decodes plainly before anyone is preempted.

A step is `schedule()` → (the executor runs the `StepRecord`) → `update_from_output()`. Only this
class changes a request's status and counters: it advances `num_computed`, starts the forks of an
n > 1 request, appends sampled tokens and checks the token stops (EOS, stop_token_ids, max_tokens,
the context), registers computed blocks in the prefix cache and keeps the counters that metrics
read. What it reports per step is plain data for the front end (`CoreOutput`, core_output.py):
new token ids, logprobs and finish reasons; text and stop strings are the front end's, which ends
a sample by `finish_sample` when one appears.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferd.engine.core.core_output import CoreOutput, SampleDelta, request_news
from inferd.engine.scheduling.adapter_slots import AdapterSlots
from inferd.engine.scheduling.background_lane import (
    background_prefill_budget,
    may_admit_background,
    split_prefills,
)
from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.record_builder import build_record
from inferd.engine.scheduling.request import (
    Request,
    Sequence,
    SequenceStatus,
    check_token_stops,
    update_block_hashes,
)
from inferd.engine.scheduling.step import KVLoad, ModelRunnerOutput, StepRecord, TokenLogprobs
from inferd.engine.scheduling.waiting_queue import WaitingQueue, running_victim, victim_for
from inferd.engine_client import EngineStats
from inferd.errors import QUEUE_TIMEOUT, InvalidRequest

LOOKAHEAD = 4  # waiting prompts whose tier lookup starts ahead of their admission

if TYPE_CHECKING:
    from inferd.engine.kv_tiers.connector import KVConnector
    from inferd.engine.scheduling.speculative import Speculation


@dataclass
class SchedulerCounters:
    """Cumulative counts since start (Prometheus counters read these)."""

    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of which found in the cache
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    steps: int = 0  # steps that scheduled something (failed ones included)
    queue_timeouts: int = 0  # requests ended unscheduled past max_queue_time


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...] = (),
        hash_root: bytes = b"",  # salt of the prefix-cache hashes (the model's identity)
        speculation: Speculation | None = None,  # drafts to verify (speculative decoding)
        adapters: AdapterSlots | None = None,  # LoRA slots (None: LoRA is not enabled)
        connector: KVConnector | None = None,  # KV tiers behind the pool (None: none)
        policy: str = "fcfs",  # the waiting queue's order: "fcfs" or "priority"
        max_queue_time: float | None = None,  # seconds a request may wait unscheduled
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.hash_root = hash_root
        self.speculation = speculation
        self.adapters = adapters
        self.connector = connector
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.sequences: dict[int, Sequence] = {}  # their samples (forks not started included)
        self.waiting = WaitingQueue(policy)
        self.max_queue_time = max_queue_time
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()
        # Structured outputs: requests whose grammar is still compiling wait here, out of the
        # FCFS queue, so they hold up no one; `failed` are those whose grammar did not compile,
        # to report with the next step.
        self.awaiting_grammar: list[Sequence] = []
        self.failed: list[CoreOutput] = []
        # Device work produced outside a step (forks) or left undone by a failed step, and the
        # sequences the device side may forget, for the next record.
        self._copies: list[tuple[int, int, int]] = []
        self._clears: list[list[int]] = [[] for _ in kv.pools]
        self._forgotten: list[int] = []
        # The KV connector's share: blocks to load before the next step, blocks named since the
        # last `take_saves` (hash, block per group) for it to keep.
        self._loads: list[KVLoad] = []
        self._saves: list[tuple[bytes, list[int]]] = []

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a validated request: its first sample waits, the others start with the fork.
        A grammar that already failed to compile raises its InvalidRequest, nothing queued."""
        compiled = req.grammar is None or req.grammar.done()
        if req.grammar is not None and compiled:
            self._attach_matchers(req)
        self.requests[req.request_id] = req
        for seq in (*req.sequences, *req.forks):
            self.sequences[seq.seq_id] = seq
        req.metrics.queued_time = time.monotonic()  # timeline: the engine has it now
        req.metrics.max_tokens_param = req.params.max_tokens
        seq = req.sequences[0]
        update_block_hashes(seq, self.kv.block_size, self.hash_root)
        seq.status = SequenceStatus.WAITING
        if compiled:
            self.waiting.add(seq)
        else:
            self.awaiting_grammar.append(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: str) -> CoreOutput | None:
        """Finish a request now ("abort") and free its blocks; None if it is not running."""
        return self._end(request_id, "abort", None)

    def finish_sample(self, request_id: str, index: int) -> bool:
        """The front end saw a stop string in sample `index`: it ends here ("stop"), its blocks
        are freed; no output, the front end knows. A no-op when it ended already. True when
        the request ended with it."""
        req = self.requests.get(request_id)
        seq = next((s for s in req.sequences if s.sample_index == index), None) if req else None
        if seq is None or seq.is_finished:
            return False
        seq.finish_reason = "stop"
        self._finish(seq)
        if req.finished:
            self._retire(req)
        return req.finished

    def fail_requests(self, request_ids: set[str], error: BaseException) -> list[CoreOutput]:
        """Finish requests with an error (their output says why); the others go on."""
        message = f"{type(error).__name__}: {error}"
        ended = [self._end(rid, "error", message) for rid in request_ids]
        return [r for r in ended if r is not None]

    def fail_step(self, record: StepRecord, error: BaseException) -> list[CoreOutput]:
        """The step could not run: fail its requests, keep its device work for the next one
        (clearing or copying a block that meanwhile went back to the pool is harmless)."""
        self._copies = record.block_copies + self._copies
        self._loads = record.kv_loads + self._loads  # their blocks are named: fill them still
        for group, blocks in enumerate(record.blocks_to_clear):
            self._clears[group] = blocks + self._clears[group]
        ids = {self.sequences[r.seq_id].request.request_id for r in record.rows
               if r.seq_id in self.sequences}  # fmt: skip
        return self.fail_requests(ids, error)

    def _end(self, request_id: str, reason: str, error: str | None) -> CoreOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        ended = []
        for seq in req.sequences:
            if not seq.is_finished:
                seq.finish_reason = reason
                self._finish(seq)
                ended.append(SampleDelta(seq.sample_index, finish_reason=reason))
        for seq in req.forks:  # never started: nothing to report
            self.sequences.pop(seq.seq_id, None)
        req.forks, req.forked, req.error = [], True, error
        self._retire(req)
        return request_news(req, ended, time.monotonic())

    def _retire(self, req: Request) -> None:
        self.requests.pop(req.request_id, None)
        if req.adapter_slot:
            self.adapters.release(req.adapter_slot)
            req.adapter_slot = 0
        req.metrics.finished_time = time.monotonic()

    def stats(self) -> EngineStats:
        c = self.counters
        spec = {}
        if self.speculation is not None:
            counts = self.speculation.metrics.counters()
            spec = {k: tuple(v) if isinstance(v, list) else v for k, v in counts.items()}
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting) + len(self.awaiting_grammar),
            kv_cache_usage=self.kv.usage,
            num_preemptions=c.num_preemptions,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            prompt_tokens=c.prompt_tokens_computed,
            generation_tokens=c.generation_tokens,
            steps=c.steps,
            num_queue_timeouts=c.queue_timeouts,
            **spec,
            **self._adapter_stats(),
        )

    def _adapter_stats(self) -> dict:
        if self.adapters is None:
            return {}
        return {"lora_resident": tuple(self.adapters.resident()),
                "lora_requests": dict(self.adapters.requests_served)}  # fmt: skip

    # ---- the step: what runs ------------------------------------------------------------------
    def schedule(self) -> StepRecord:
        if self.max_queue_time is not None:
            self._drop_expired(time.monotonic())
        if self.awaiting_grammar:
            self._admit_compiled()
        budget = self.max_num_batched_tokens
        chosen: list[tuple[Sequence, int, list[int]]] = []  # (sequence, tokens, drafts)
        preempted: list[Sequence] = []
        decodes = [s for s in self.running if s.num_tokens - s.num_computed == 1]
        prefills = [s for s in self.running if s.num_tokens - s.num_computed > 1]
        drafts_of = self._plan_drafts(decodes, prefills, budget)
        # NOTE: background prompts go after the waiting queue (engine/scheduling/
        # background_lane.py): they take only what interactive prompts leave of the step.
        prefills, background = split_prefills(prefills)
        budget -= self._schedule_running(decodes + prefills, budget, drafts_of, chosen, preempted)

        stalled = bool(preempted)  # running sequences lacked blocks: admit no one this step
        if self.connector is not None and not stalled:
            self._look_ahead()
        skipped = 0  # waiting sequences passed over: their adapter has no slot yet
        lane_open = True  # background sequences may be admitted (background_lane.py)
        while not stalled and len(self.waiting) > skipped and budget > 0:
            seq = self.waiting[skipped]
            if seq.request.background:  # the lane's rule 3 (background_lane.py)
                lane_open = lane_open and may_admit_background(self.waiting, self.running, chosen)
                if not lane_open:
                    skipped += 1  # NOTE: it keeps its place, holding nothing
                    continue
            if len(self.running) >= self.max_num_seqs:
                if self._make_room(seq, chosen, preempted):
                    budget = self.max_num_batched_tokens - sum(n for _, n, _ in chosen)
                    continue
                break
            if not self._has_adapter_slot(seq.request):
                skipped += 1  # NOTE: it keeps its place; the ones behind it may run now
                continue
            prefix, loaded = None, None
            start = seq.num_computed  # nonzero only for a forked child waiting for a slot
            if start == 0 and not seq.request.needs_every_position:
                # NOTE: prompt logprobs need every prompt position's logits, mean and cls
                # pooling every hidden state: no cache reuse for them.
                if self.connector is not None and not self.connector.ready(seq.seq_id):
                    break  # its blocks are on their way from a tier
                prefix = self.kv.find_cached_prefix(seq)
                if self.connector is not None:
                    prefix, loaded = self._with_loaded_blocks(seq, prefix)
                start = prefix[0]
            n = min(seq.num_tokens - start, budget)
            if seq.request.background:  # within the lane's budget (rule 1)
                n = min(n, background_prefill_budget(chosen, budget))
            if not self.kv.allocate(seq, n, prefix):
                if loaded is not None:
                    self.kv.drop_loaded(loaded.blocks)
                if self._make_room(seq, chosen, preempted):
                    # NOTE: its tier lookup (if any) was taken; the retry finds the pool's
                    # prefix again and recomputes what the tier had delivered.
                    budget = self.max_num_batched_tokens - sum(n for _, n, _ in chosen)
                    continue
                break
            if loaded is not None:
                self.kv.settle_loaded(loaded.blocks)
                self._loads.append(loaded)
            del self.waiting[skipped]
            if seq.num_computed == 0 and seq.request.metrics.first_scheduled_time is None:
                self.counters.prefix_cache_queries += seq.num_tokens
                self.counters.prefix_cache_hits += start
                seq.request.metrics.num_cached_tokens = start
            seq.num_computed = start
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chosen.append((seq, n, []))
            budget -= n
        lane = background_prefill_budget(chosen, budget)  # rules 1 and 2
        if background and lane:
            self._schedule_running(background, lane, {}, chosen, preempted)
        return self._record(chosen, preempted)

    def _schedule_running(self, seqs: list[Sequence], budget: int, drafts_of: dict,
                          chosen: list, preempted: list[Sequence]) -> int:  # fmt: skip
        """Running sequences in order, each taking what it has left within `budget`; one that
        lacks blocks preempts another (or itself). Returns the tokens taken."""
        left = budget
        for seq in seqs:
            if left == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed, left)
            drafts = drafts_of.get(seq.seq_id, [])
            n += len(drafts)
            while not self.kv.allocate(seq, n):
                if drafts:  # no blocks for the drafts: decode plainly before preempting anyone
                    n, drafts = n - len(drafts), []
                    continue
                taken = {id(s) for s, _, _ in chosen}
                victims = [s for s in self.running if id(s) not in taken and s is not seq]
                victim = running_victim(seq, victims, self.waiting.policy)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                chosen.append((seq, n, drafts))
                left -= n
        return budget - left

    def _make_room(self, head: Sequence, chosen: list, preempted: list[Sequence]) -> bool:
        """Under the priority policy: preempt the running sequence of the lowest priority below
        the waiting `head`'s (taking it out of this step if it was chosen), so that `head` may
        take its seat and blocks. False when there is none (and always under fcfs)."""
        if self.waiting.policy != "priority":
            return False
        victim = victim_for(head, self.running)
        if victim is None:
            return False
        chosen[:] = [c for c in chosen if c[0] is not victim]
        self._preempt(victim)
        preempted.append(victim)
        return True

    def _drop_expired(self, now: float) -> None:
        """End the requests that waited `max_queue_time` since their arrival and were never
        scheduled ("queue_timeout"): their place, blocks and grammar work are freed, and the
        front end answers 503. A request that ran once (preempted, or a fork waiting for a
        seat) is not waiting for admission and is never cut."""
        limit = self.max_queue_time
        expired = {s.request.request_id for s in (*self.waiting, *self.awaiting_grammar)
                   if s.request.metrics.first_scheduled_time is None
                   and now - s.request.metrics.arrival_time >= limit}  # fmt: skip
        for request_id in expired:
            waited = now - self.requests[request_id].metrics.arrival_time
            message = (f"the request waited {waited:.1f} s in the queue without being "
                       f"scheduled, past the server's limit of {limit:g} s "
                       "(--max-queue-time); retry later")  # fmt: skip
            self.failed.append(self._end(request_id, QUEUE_TIMEOUT, message))
            self.counters.queue_timeouts += 1

    def _look_ahead(self) -> None:
        """Start the tier lookups of the first waiting prompts (once each), from the block
        past what the pool holds now."""
        for seq in list(self.waiting)[:LOOKAHEAD]:
            if seq.num_computed or seq.request.needs_every_position:
                continue
            if seq.seq_id not in self.connector.lookups:
                limit = (seq.num_tokens - 1) // self.kv.block_size  # one token left to compute
                first = self.kv.find_cached_prefix(seq)[0] // self.kv.block_size
                self.connector.look_ahead(seq.seq_id, seq.block_hashes[:limit], first)

    def _with_loaded_blocks(self, seq: Sequence, prefix) -> tuple[tuple, KVLoad | None]:
        """The pool's `prefix` extended by the blocks a tier delivered for `seq`, with the load
        that fills them; as it was when none arrived or the pool has no room for them."""
        bs = self.kv.block_size
        rows = self.connector.take(seq.seq_id, prefix[0] // bs, (seq.num_tokens - 1) // bs)
        if rows is None:
            return prefix, None
        added = self.kv.add_loaded_blocks(prefix, seq.block_hashes, rows.shape[0])
        if added is None:
            return prefix, None
        longer, blocks = added
        return longer, KVLoad(blocks, rows)

    def take_saves(self) -> list[tuple[bytes, list[int]]]:
        """Blocks named since the last call, (hash, block per group), for the KV connector to
        copy out before the next step can reuse them."""
        saves, self._saves = self._saves, []
        return saves

    def _has_adapter_slot(self, req: Request) -> bool:
        """Whether the request runs under the base model or holds its adapter's slot (taken
        now if one is free or can be evicted)."""
        if req.lora is None or req.adapter_slot:
            return True
        slot = self.adapters.acquire(req.lora) if self.adapters is not None else None
        if slot is None:
            return False
        req.adapter_slot = slot
        return True

    def _plan_drafts(self, decodes: list[Sequence], prefills: list[Sequence], budget: int):
        """seq_id → drafts to verify (speculative decoding), within the step's budget: decodes
        come first, so their drafts always fit."""
        decodes = [s for s in decodes if s.request.pooling is None]  # a prompt's last token
        if self.speculation is None or not decodes:
            return {}
        base = min(budget, len(decodes) + sum(s.num_tokens - s.num_computed for s in prefills))
        return self.speculation.plan(decodes[:budget], base, budget)

    def _record(self, chosen: list[tuple[Sequence, int, list[int]]],
                preempted: list[Sequence]) -> StepRecord:  # fmt: skip
        if not chosen:  # nothing runs: the device side hears of the forgotten ones next time
            return StepRecord(preempted_seq_ids=[s.seq_id for s in preempted])
        forgotten, self._forgotten = self._forgotten, []
        self.counters.steps += 1
        record = build_record(chosen, len(self.kv.pools), time.monotonic())
        record.finished_seq_ids = forgotten
        record.preempted_seq_ids = [s.seq_id for s in preempted]
        if self.adapters is not None:
            record.adapter_loads = self.adapters.take_loads()
        fresh = self.kv.take_fresh_blocks()
        record.blocks_to_clear = [a + b for a, b in zip(self._clears, fresh, strict=True)]
        record.block_copies, self._copies = self._copies, []
        record.kv_loads, self._loads = self._loads, []
        self._clears = [[] for _ in self.kv.pools]
        return record

    def _attach_matchers(self, req: Request) -> None:
        """Every sample of `req` (started or still waiting to fork) gets a fresh matcher of its
        compiled grammar; raises the request's InvalidRequest when it did not compile."""
        req.grammar.check()
        for seq in (*req.sequences, *req.forks):
            seq.matcher = req.grammar.new_matcher()

    def _admit_compiled(self) -> None:
        """Requests whose grammar finished compiling join the queue (their samples get their
        matchers), or fail with the compile error."""
        for seq in [s for s in self.awaiting_grammar if s.request.grammar.done()]:
            self.awaiting_grammar.remove(seq)
            req = seq.request
            try:
                self._attach_matchers(req)
            except InvalidRequest as e:
                self.failed.append(self._end(req.request_id, "error", f"InvalidRequest: {e}"))
                continue
            self.waiting.add(seq)

    def take_failed(self) -> list[CoreOutput]:
        """Requests that ended outside a step (their grammar did not compile), once each."""
        failed, self.failed = [r for r in self.failed if r is not None], []
        return failed

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.request.metrics.num_preemptions += 1
        seq.request.metrics.preemption_times += (time.monotonic(),)
        self.waiting.put_back(seq)
        self.counters.num_preemptions += 1

    # ---- the step: what came of it ------------------------------------------------------------
    def update_from_output(self, record: StepRecord,
                           result: ModelRunnerOutput) -> list[CoreOutput]:  # fmt: skip
        """Apply a step's results. Returns what the front end needs to hear: per request that
        got tokens (or prompt logprobs, or ended), what is new."""
        if len(result.sampled_token_ids) != len(record.sample_ids):
            raise ValueError(
                f"the step sampled {len(result.sampled_token_ids)} sequences, but "
                f"{len(record.sample_ids)} were scheduled to sample"
            )
        now = time.monotonic()
        index = 0
        touched: dict[str, Request] = {}
        news: dict[str, list[SampleDelta]] = {}  # request id → its samples' news
        prompt_news: dict[str, list[TokenLogprobs]] = {}
        for row in record.rows:
            seq = self.sequences[row.seq_id]
            req = seq.request
            touched[req.request_id] = req
            samples = news.setdefault(req.request_id, [])
            computed = row.num_new_tokens
            if row.draft_token_ids:
                # Verified: the KV of the last token and of the accepted drafts stays.
                computed = len(result.sampled_token_ids[index])
                self.speculation.verified(seq, len(row.draft_token_ids), computed - 1)
            elif row.num_new_tokens > 1 or seq.num_output_tokens == 0:  # not a decode
                self.counters.prompt_tokens_computed += row.num_new_tokens
            seq.num_computed += computed
            if row.seq_id in result.prompt_logprobs:
                entries = result.prompt_logprobs[row.seq_id]
                prompt_news.setdefault(req.request_id, []).extend(map(TokenLogprobs.of, entries))
            for sample_id in row.sample_ids:
                sample = self.sequences[sample_id]
                if sample is not seq:
                    self._start_fork(seq, sample)
                lps = result.logprobs[index] if result.logprobs else None
                samples.append(self._append(sample, result.sampled_token_ids[index], lps, now))
                index += 1
            if row.fork_seq_ids:
                req.sequences += req.forks
                req.forks, req.forked = [], True
            if row.seq_id in result.embeddings:  # an embedding request's prompt is done
                req.embedding = result.embeddings[row.seq_id]
                seq.finish_reason = "stop"  # freed below, once its blocks are cached
                samples.append(SampleDelta(seq.sample_index, finish_reason="stop"))
        for row in record.rows:
            seq = self.sequences[row.seq_id]
            named = self.kv.cache_computed_blocks(seq)
            if self.connector is not None:
                self._saves += named
            if row.draft_token_ids and seq.finish_reason is None:
                self.kv.release_tail(seq)  # blocks that held only rejected drafts
            if seq.request.pooling is not None and seq.finish_reason is not None:
                self._finish(seq)
        if self.speculation is not None:
            self.speculation.observe_step(record, result)
        for sample_id in record.sample_ids:
            seq = self.sequences[sample_id]
            if seq.finish_reason is not None and not seq.is_finished:
                self._finish(seq)
        outputs = []
        for request_id, req in touched.items():
            if req.finished:
                self._retire(req)
            samples, prompt = news[request_id], prompt_news.get(request_id)
            if samples or prompt or req.finished:
                outputs.append(request_news(req, samples, now, prompt))
        return outputs

    def _append(self, seq: Sequence, tokens: list[int], logprobs, now: float) -> SampleDelta:
        """Append sampled tokens until one ends the sequence (later ones are dropped)."""
        req = seq.request
        delta = SampleDelta(seq.sample_index, [], [] if logprobs is not None else None)
        for i, token in enumerate(tokens):
            seq.token_ids.append(token)
            check_token_stops(seq, token, self.eos_token_ids, self.max_model_len)
            if seq.matcher is not None:
                req.grammar.accept(seq, token)
            update_block_hashes(seq, self.kv.block_size, self.hash_root)
            delta.new_token_ids.append(token)
            if logprobs is not None and logprobs[i] is not None:
                delta.new_logprobs.append(TokenLogprobs.of(logprobs[i]))
            m = req.metrics
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            m.num_generation_tokens += 1
            self.counters.generation_tokens += 1
            if seq.finish_reason is not None:
                break
        delta.finish_reason, delta.stop_reason = seq.finish_reason, seq.stop_reason
        return delta

    def _start_fork(self, parent: Sequence, child: Sequence) -> None:
        """Start `child` on the parent's KV blocks (the copy of the partly filled last block is
        made before the next step). Without room (a running slot and one block per group) the
        child instead waits and recomputes its prompt, mostly from the prefix cache."""
        # The child's tokens are the prompt: its full blocks hash like the parent's.
        child.block_hashes = parent.block_hashes[: child.num_tokens // self.kv.block_size]
        copies = None
        if len(self.running) < self.max_num_seqs:
            copies = self.kv.fork(parent, child)
        if copies is None:
            child.num_computed = 0
            child.status = SequenceStatus.WAITING
            self.waiting.add(child)
            return
        child.num_computed = parent.num_computed
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        self._copies += copies

    def _finish(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.awaiting_grammar:
            self.awaiting_grammar.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        self.sequences.pop(seq.seq_id, None)
        if seq.sent:
            self._forgotten.append(seq.seq_id)
        if self.speculation is not None:
            self.speculation.forget(seq)
        if self.connector is not None:
            self.connector.forget(seq.seq_id)
