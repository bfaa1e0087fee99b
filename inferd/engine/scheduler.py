"""The token-budget scheduler: continuous batching, chunked prefill, prefix reuse, preemption.

Every step hands out at most `max_num_batched_tokens` tokens:

1. running sequences first, decodes (one token each) before unfinished prefills, oldest first;
2. then waiting sequences in arrival order (FCFS: the queue head is never skipped), each
   starting after its longest cached prefix and taking what is left of the budget, so a prompt
   longer than the budget is prefilled in chunks over several steps.

When a pool cannot give a running sequence its next blocks, the newest running sequence is
preempted: its blocks are freed and it goes back to the head of the queue, to be recomputed
(cheaply, through the prefix cache) when memory allows. A step that preempts admits no one.
Every sequence fits the pool alone (checked at admission), so the oldest one always progresses.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    # True when this step reaches the sequence's last known token (sample after it). Fixed at
    # scheduling time: the engine advances num_computed before it samples.
    needs_logits: bool = False

    def __post_init__(self) -> None:
        self.needs_logits = self.seq.num_computed + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass
class SchedulerCounters:
    """Cumulative counts since start (Prometheus counters read these)."""

    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of which found in the cache
    prompt_tokens_computed: int = 0


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()

    # ---- queue management --------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.request.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.counters.num_preemptions += 1

    # ---- the step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        chosen: set[int] = set()
        preempted: list[Sequence] = []
        decodes = [s for s in self.running if s.num_tokens - s.num_computed == 1]
        prefills = [s for s in self.running if s.num_tokens - s.num_computed > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self.kv.allocate(seq, n):
                victims = [s for s in self.running if s.seq_id not in chosen and s is not seq]
                victim = victims[-1] if victims else seq
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSequence(seq, n))
                chosen.add(seq.seq_id)
                budget -= n

        while not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[0]
            prefix = None
            start = seq.num_computed  # nonzero only for a forked child waiting for a slot
            if start == 0 and not seq.request.params.prompt_logprobs:
                # NOTE: prompt logprobs need every prompt position's logits, so no cache reuse.
                prefix = self.kv.find_cached_prefix(seq)
                start = prefix[0]
            n = min(seq.num_tokens - start, budget)
            if not self.kv.allocate(seq, n, prefix):
                break
            self.waiting.popleft()
            if seq.num_computed == 0 and seq.request.metrics.first_scheduled_time is None:
                self.counters.prefix_cache_queries += seq.num_tokens
                self.counters.prefix_cache_hits += start
                seq.request.metrics.num_cached_tokens = start
            seq.num_computed = start
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSequence(seq, n))
            chosen.add(seq.seq_id)
            budget -= n
        return SchedulerOutput(scheduled, preempted)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]]:
        """Start `child` on the parent's KV blocks; returns device block copies to make.
        Without room (a running slot and one block per group) the child instead waits and
        recomputes its prompt, mostly from the prefix cache."""
        copies = None
        if len(self.running) < self.max_num_seqs:
            copies = self.kv.fork(parent, child)
        if copies is None:
            child.num_computed = 0
            self.add(child)
            return []
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        return copies
