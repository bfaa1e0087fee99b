"""An engine core in its own process behind `EngineCore`'s interface, for a blocking caller:
`LLMEngine(core_process=True)` (`LLM(engine_core_process=True)`) drives it like an in-process
core, one `step()` at a time. It talks to the core through the `CoreClient` contract
(transport/contract.py); the core steps in its own loop (core_loop.py) meanwhile.

    add_request   sent at once; only a constrained request waits for the core's answer (so a
                  bad grammar raises here, as in-process); other refusals come back as the
                  request's error with a later step
    step()        the core's next message with news (it runs ahead on its own; this only
                  collects), or [] after `STEP_WAIT_S` without one
    abort, finish_sample   sent at once; the core applies them before its next step
"""

from __future__ import annotations

import time
from collections import deque

from inferd.engine.core.core_output import CoreOutput, CoreRequest, RequestEvents
from inferd.engine.transport import ipc
from inferd.engine.transport.core_process import CoreProcess
from inferd.engine_client import EngineStats, TraceFiles
from inferd.errors import EngineDeadError
from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import StepTiming

STEP_WAIT_S = 0.5  # step() returns [] after this long without news (a caller may be stopped)


class ProcessCore:
    def __init__(self, config, stall_timeout: float = 60.0):
        from inferd.loader import open_checkpoint
        from inferd.tokenizer import checkpoint_tokenizer

        self.config = config
        checkpoint = open_checkpoint(config.model)
        self.model_config = checkpoint.config
        self.tokenizer = checkpoint_tokenizer(checkpoint)
        self.setup = None  # the model lives in the other process
        self.process = CoreProcess()  # a CoreClient (transport/contract.py)
        self.process.start(config, stall_timeout)
        try:
            ready = self.process.wait_ready()
        except BaseException:
            self.process.stop(5)
            raise
        self.model_info, self.max_model_len = ready.model_info, ready.max_model_len
        self.dead: str | None = None
        self._inbox: deque = deque()
        self._stats = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)
        self._call_ids = iter(range(1 << 62))

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: CoreRequest) -> None:
        self._check_alive()
        self.process.send(ipc.Add(request))
        if request.params.structured_outputs is not None:
            rid = request.request_id
            ack = self._wait(lambda m: isinstance(m, ipc.Outputs)
                             and any(a.request_id == rid for a in m.acks))  # fmt: skip
            self._inbox.append(ack)  # its outputs are other requests' news, for step()
            for a in ack.acks:
                if a.request_id == request.request_id and a.error_type is not None:
                    raise ipc.rebuild_error(a.error_type, a.param, a.message)

    def compile_grammar(self, params):
        return None  # the core compiles it; a bad one is refused by add_request

    def abort_request(self, request_id: str) -> bool:
        self.process.send(ipc.Abort([request_id]))
        return True

    def finish_sample(self, request_id: str, index: int) -> None:
        from inferd.engine.core.core_output import SampleFinish

        self.process.send(ipc.Finish([SampleFinish(request_id, index)]))

    def has_unfinished_requests(self) -> bool:
        return bool(self._inbox)  # NOTE: the front end knows which of its requests still run

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[CoreOutput]:
        message = self._inbox.popleft() if self._inbox else self._receive(STEP_WAIT_S)
        while message is not None and not isinstance(message, ipc.Outputs):
            message = self._inbox.popleft() if self._inbox else self._receive(STEP_WAIT_S)
        if message is None:
            return []
        if message.stats is not None:
            self._stats = message.stats
        errors = [(a.request_id, f"{a.error_type}: {a.message}")
                  for a in message.acks if a.error_type is not None]  # fmt: skip
        errors += [(f.request_id, f.message) for f in message.failed]
        now = time.monotonic()
        return [CoreOutput(rid, [], now, RequestEvents(), None, True, error)
                for rid, error in errors] + message.outputs  # fmt: skip

    def stats(self) -> EngineStats:
        return self._stats

    def step_timing(self) -> StepTiming | None:
        return self._stats.step_timing

    def step_efficiency(self) -> StepEfficiency | None:
        return self._stats.step_efficiency

    def start_profile(self, directory: str) -> None:
        self._call("start_profile", directory)

    def stop_profile(self) -> TraceFiles:
        return TraceFiles(**self._call("stop_profile"))

    def rank_reports(self) -> list[dict]:
        return self._call("rank_reports")

    def clear_kv_tiers(self) -> int:
        return self._call("clear_kv_tiers")

    def sleep(self, level: int) -> dict:
        return self._call("sleep", level)

    def wake_up(self) -> dict:
        return self._call("wake_up")

    def shutdown(self) -> None:
        self.process.stop()

    # ---- messages ----------------------------------------------------------------------------
    def _call(self, method: str, *args):
        self._check_alive()
        call_id = next(self._call_ids)
        self.process.send(ipc.Call(call_id, method, list(args)))
        answer = self._wait(lambda m: isinstance(m, ipc.CallResult) and m.call_id == call_id)
        if answer.error_type is not None:
            raise ipc.rebuild_error(answer.error_type, None, answer.message)
        return answer.result

    def _wait(self, wanted):
        """Receive until `wanted(message)`; the others wait in the inbox for step()."""
        while True:
            message = self._receive(None)
            if wanted(message):
                return message
            self._inbox.append(message)

    def _receive(self, timeout: float | None):
        """The core's next message (None after `timeout`); EngineDeadError once it is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_alive()
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            message = self.process.recv(max(0.0, left))
            if message is not None:
                return message
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _check_alive(self) -> None:
        if self.dead is None and not self.process.alive:
            self.dead = f"the engine core process exited (exit code {self.process.exitcode})"
        if self.dead is not None:
            raise EngineDeadError(self.dead)
