"""An engine replica's streaming `generate` over a scripted engine client (no cluster): the
engine's verdict comes first, outputs that piled up go as the latest one, a failure after the
start is sent typed, and a call the ingress gives up aborts the engine request."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("ray.serve")

from inferd.errors import InvalidRequest, RequestFailed  # noqa: E402
from inferd.outputs import CompletionOutput, RequestOutput  # noqa: E402
from inferd.ray_serve.replica import EngineReplica  # noqa: E402
from inferd.ray_serve.wire import Accepted, EngineCall, Failed, PromptMemo, Refused  # noqa: E402
from inferd.sampling_params import SamplingParams  # noqa: E402


class ScriptedEngine:
    """add_request puts `script` into the request's queue at once."""

    def __init__(self, script: list):
        self.script, self.aborted, self.arrivals = script, [], []

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        if prompt == "bad":
            raise InvalidRequest("prompt", "prompt must not be bad")
        self.arrivals.append(arrival_time)
        for item in self.script:
            outputs.put_nowait(item)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class UnservedReplica(EngineReplica):
    def __del__(self) -> None:  # Serve awaits the async one on shutdown; nothing to stop here
        pass


def _replica(engine: ScriptedEngine) -> EngineReplica:
    replica = object.__new__(UnservedReplica)  # no Serve context: only what generate reads
    replica.client, replica.replica, replica.node = engine, "rep-a", "node-1"
    return replica


def _out(n: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", "hi", [2, 3], [CompletionOutput(0, "x" * n, [5] * n)], finished)


async def _all(gen) -> list:
    return [item async for item in gen]


def _call(prompt="hi", waited_s: float = 0.0) -> EngineCall:
    return EngineCall("r", prompt, SamplingParams(), waited_s)


def test_the_verdict_first_then_the_latest_of_what_piled_up():
    engine = ScriptedEngine([_out(1), _out(2), _out(3, finished=True)])
    items = asyncio.run(_all(_replica(engine).generate(_call(waited_s=2.0))))
    assert isinstance(items[0], Accepted) and items[0].replica == "rep-a"
    [only] = items[1:]  # three cumulative outputs were waiting: the last says it all
    assert only.finished and len(only.outputs[0].token_ids) == 3
    assert PromptMemo().fill(only).prompt_token_ids == [2, 3]
    assert 1.5 < time.monotonic() - engine.arrivals[0] < 3.0  # arrival on this clock
    assert engine.aborted == []


def test_a_refused_request_is_one_item():
    [refused] = asyncio.run(_all(_replica(ScriptedEngine([])).generate(_call("bad"))))
    assert isinstance(refused, Refused) and refused.error.param == "prompt"


def test_a_failure_after_the_start_follows_the_last_output():
    engine = ScriptedEngine([_out(1), RequestFailed("the step raised")])
    items = asyncio.run(_all(_replica(engine).generate(_call())))
    assert [type(i) for i in items] == [Accepted, RequestOutput, Failed]
    assert items[2].error.error().args == ("the step raised",) and engine.aborted == []


def test_an_abandoned_call_aborts_the_engine_request():
    async def main() -> ScriptedEngine:
        engine = ScriptedEngine([_out(1)])  # never finishes
        gen = _replica(engine).generate(_call())
        assert isinstance(await gen.__anext__(), Accepted)
        await gen.aclose()  # the ingress cancelled right after the verdict
        gen2 = _replica(engine).generate(_call())
        await gen2.__anext__()
        assert (await gen2.__anext__()).outputs[0].token_ids == [5]
        await gen2.aclose()
        return engine

    assert asyncio.run(main()).aborted == ["r", "r"]
