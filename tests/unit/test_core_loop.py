"""The one step loop (engine/core/core_loop.py), scripted core, in-memory transport: a step that
raises fails exactly the requests in flight; one a stop string ended (no output says so) is not."""

from __future__ import annotations

from types import SimpleNamespace

from inferd.engine.core.core_loop import CoreLoop
from inferd.engine.core.core_output import SampleFinish
from inferd.engine.transport import ipc
from inferd.engine_client import EngineStats


class ScriptedCore:  # requests in; its first step raises
    def __init__(self):
        self.requests, self.steps = set(), 0

    def compile_grammar(self, params):
        return None

    def add_request(self, request):
        self.requests.add(request.request_id)

    def finish_sample(self, request_id, index) -> bool:
        self.requests.discard(request_id)
        return True  # its only sample: the request ended

    def abort_request(self, request_id) -> bool:
        return request_id in self.requests

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) and self.steps == 0

    def step(self):
        self.steps += 1
        raise RuntimeError("kernel exploded")

    def stats(self):
        return EngineStats(len(self.requests), 0, 0.0, 0, 0, 0, 0, 0, self.steps)


class ListTransport:  # its commands once; the front end is gone when the loop has nothing to do
    idle_wait_s = 0.0

    def __init__(self, commands):
        self.commands, self.sent = commands, []

    def wait(self, timeout):
        return bool(self.commands)

    def take(self):
        taken, self.commands = self.commands, []
        return taken

    def send(self, message):
        self.sent.append(message)

    def front_end_gone(self, busy):
        return not busy


def test_a_raising_step_fails_the_requests_in_flight_and_only_those():
    adds = [ipc.Add(SimpleNamespace(request_id=r, params=None)) for r in ("a", "b")]
    transport = ListTransport([*adds, ipc.Finish([SampleFinish("a", 0)])])
    CoreLoop(ScriptedCore(), transport, stall_timeout=1.0).run()
    [outputs] = [m for m in transport.sent if isinstance(m, ipc.Outputs)]
    assert [a.request_id for a in outputs.acks] == ["a", "b"]
    assert [f.request_id for f in outputs.failed] == ["b"]
    assert "kernel exploded" in outputs.failed[0].message
