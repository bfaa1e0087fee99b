"""The scheduler's waiting queue and its policy (vLLM's `--scheduling-policy`).

    fcfs      arrival order; a preempted sequence goes back to the head
    priority  (request.priority, arrival) order: a lower value first, ties by arrival; a
              preempted sequence goes back to its place by the same key (its arrival is early,
              so it is ahead of later arrivals of its priority)

The scheduler reads the queue from its head and never skips the head (but for a LoRA request
without a slot), so this order is the admission order. Under `priority` a waiting head that
cannot be admitted may also take the place of a running sequence of a strictly lower priority
(`victim_for`): never one of the same or a higher priority, so equal priorities stay FCFS and
nobody is preempted to make room for a peer.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.engine.scheduling.request import Sequence

POLICIES = ("fcfs", "priority")


def order_key(seq: Sequence) -> tuple[int, float, int]:
    """Lower first: priority, then arrival at the server, then the sequence's id (the order in
    which the core took requests that arrived in the same instant)."""
    req = seq.request
    return (req.priority, req.metrics.arrival_time, seq.seq_id)


class WaitingQueue(deque):
    """A deque whose insertions follow the policy; reading and removing are the deque's."""

    def __init__(self, policy: str = "fcfs"):
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(POLICIES)}, "
                             f"got {policy!r}")  # fmt: skip
        self.policy = policy

    def add(self, seq: Sequence) -> None:
        """A new arrival (or a fork waiting for a slot)."""
        if self.policy == "fcfs":
            self.append(seq)
        else:
            self._insert(seq)

    def put_back(self, seq: Sequence) -> None:
        """A preempted sequence: first in line again under fcfs, in its place under priority."""
        if self.policy == "fcfs":
            self.appendleft(seq)
        else:
            self._insert(seq)

    def _insert(self, seq: Sequence) -> None:
        # NOTE: a deque has no bisect of its own; the queue is short next to a step's work.
        keys = [order_key(s) for s in self]
        self.insert(bisect.bisect_right(keys, order_key(seq)), seq)


def victim_for(head: Sequence, running: list[Sequence]) -> Sequence | None:
    """The running sequence that makes room for `head` under the priority policy: the lowest
    priority (highest value), the newest among equals; None when every running sequence's
    priority is as high as the head's or higher."""
    lower = [s for s in running if s.request.priority > head.request.priority]
    return max(lower, key=order_key, default=None)


def running_victim(seq: Sequence, candidates: list[Sequence], policy: str) -> Sequence:
    """Whom to preempt when running `seq` cannot get its next blocks: the newest candidate
    under fcfs (`seq` itself when no other is left); under priority the lowest priority among
    the candidates and `seq`, the newest among equals."""
    if policy == "fcfs":
        return candidates[-1] if candidates else seq
    return max([*candidates, seq], key=order_key)
