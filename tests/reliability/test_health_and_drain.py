"""Liveness by progress (a long step under load is not a stall; a step that never ends is), the
drain's order (wait, then end the rest), and a log that one bug cannot flood. Fake engines, no
model: about three seconds in all."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

from test_server_failures import FakeEngine, run_request, with_engine

from inferd.engine_client import EngineStats
from inferd.server.http.admission import Admission, AdmissionLimits
from inferd.server.http.drain import Drain
from inferd.server.http.errors import ErrorLog


class TimedEngine(FakeEngine):
    """Each step takes `plan[i]` = (seconds, tokens); steps past the plan wait for `gate`."""

    def __init__(self, plan, budget, gate):
        super().__init__()
        self.plan, self.stuck = plan, gate
        self.setup = SimpleNamespace(max_num_batched_tokens=budget)
        self.tokens = 0

    def step(self):
        if self.requests and self.steps < len(self.plan):
            seconds, tokens = self.plan[self.steps]
            time.sleep(seconds)
            self.tokens += tokens
        elif self.requests:
            self.stuck.wait()
        return super().step()

    def stats(self):
        return EngineStats(len(self.requests), 0, 0.0, 0, 0, 0, 0, self.tokens, self.steps)


def test_a_long_step_at_the_usual_speed_is_progress_and_a_step_that_never_ends_is_a_stall():
    # Three quick decode steps (10 tokens in 20 ms), then a 60-token prefill chunk that takes
    # 300 ms: longer than stall_timeout (0.2 s), as slow per token as the engine usually is.
    plan = [(0.02, 10)] * 3 + [(0.3, 60)]
    gate = threading.Event()

    async def body(engine):
        task = asyncio.ensure_future(run_request(engine, "a", max_tokens=10))
        while engine.engine.steps < 3:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.25)  # inside the long step
        during_long_step = engine.health()
        while engine.engine.steps < 4:
            await asyncio.sleep(0.005)
        bound = engine.stall_bound()
        await asyncio.sleep(bound + 0.2)  # the fifth step never ends
        stalled = engine.health()
        gate.set()
        await task
        return during_long_step, bound, stalled

    during, bound, stalled = with_engine(TimedEngine(plan, 64, gate), body, stall_timeout=0.2)
    assert during is None
    assert 0.2 < bound < 3  # stall_timeout plus 4 x the slowest step speed x 64 tokens
    assert stalled is not None and "no progress" in stalled


class FakeGroup:
    def __init__(self, reservation):
        self.reservation, self.failed = reservation, None
        reservation.group = self

    def fail(self, error):
        self.failed = error
        self.reservation.release()


def test_the_drain_waits_for_requests_then_ends_the_rest():
    admission = Admission(AdmissionLimits(max_model_len=64))
    quick = FakeGroup(admission.admit(["a"], n=1))
    slow = FakeGroup(admission.admit(["b"], n=1))

    async def main():
        asyncio.get_running_loop().call_later(0.05, quick.reservation.release)  # finishes
        started = time.monotonic()
        await Drain(admission, timeout_s=0.3).run()
        return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert admission.draining and not admission.live
    assert quick.failed is None
    assert slow.failed is not None and slow.failed.status == 503
    assert "--shutdown-timeout" in slow.failed.message
    assert 0.3 <= elapsed < 2


def test_unexpected_errors_are_one_line_each_with_one_traceback_per_period(caplog):
    errors = ErrorLog(traceback_every_s=60)
    with caplog.at_level(logging.ERROR, logger="inferd.server.http.errors"):
        ids = [errors.internal(ValueError(f"boom\nline {i}"), "POST /x").message for i in range(5)]
    records = [r for r in caplog.records if r.name == "inferd.server.http.errors"]
    assert len(records) == 5
    assert sum(r.exc_info is not None for r in records) == 1
    assert all("\n" not in r.getMessage() for r in records)
    assert all(i.split("id ")[1].rstrip(")") in r.getMessage() for i, r in zip(ids, records))


def test_a_slow_small_step_does_not_pass_for_a_slow_speed_per_token():
    # A one-token step that takes 0.3 s (a kernel built on first use) is not 0.3 s per token:
    # taken as a speed, a full 64-token step would get 77 s before it counted as a stall.
    plan = [(0.3, 1), (0.01, 60), (0.01, 60)]
    gate = threading.Event()

    async def body(engine):
        task = asyncio.ensure_future(run_request(engine, "a", max_tokens=10))
        while engine.engine.steps < 3:
            await asyncio.sleep(0.005)
        bound = engine.stall_bound()
        gate.set()
        await task
        return bound

    bound = with_engine(TimedEngine(plan, 64, gate), body, stall_timeout=0.2)
    assert 0.2 + 4 * 0.3 <= bound < 3  # a margin over the slowest step, not 64 x its rate
