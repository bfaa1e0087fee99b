"""The server's failure behaviour, driven by a scripted fake engine (no model, milliseconds):
a step that raises fails its requests but not the loop; a dead loop turns /health red and
errors every request, in flight or new; a stalled loop turns /health red; an error after a
stream started arrives as an SSE error event followed by [DONE]; an idle loop does not spin."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from starlette.testclient import TestClient

from inferd.engine.frontend.async_engine import AsyncEngine
from inferd.engine_client import EngineStats, ModelInfo
from inferd.errors import EngineDeadError, InvalidRequest, RequestFailed
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferd.server.app import ServerSettings, create_app

VOCAB = 64


class Fatal(BaseException):
    """Not an Exception: gets past the engine's own guards, as a real bug in the loop would."""


class FakeTokenizer:
    chat_template = "fake"
    all_special_ids = (0,)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [1 + ord(c) % (VOCAB - 1) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join("x" for i in ids if not (skip_special_tokens and i == 0))

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [f"t{i}" for i in ids]

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs) -> str:
        return " ".join(str(m["content"]) for m in messages)

    def chat_prompt(self, messages, add_generation_prompt=True, **kwargs):
        text = self.apply_chat_template(messages, add_generation_prompt)
        return text, self.encode(text, add_special_tokens=False)


class FakeEngine:
    """Every step adds token 5 ('x') to each request. Knobs: `fail_at` (step number that raises
    RuntimeError), `die_at` (step that raises Fatal), `error_at` (step whose outputs carry the
    engine's per-request error), `gate` (an Event each step waits for)."""

    def __init__(self, fail_at=None, die_at=None, error_at=None, gate=None, schedulable=True,
                 tokenizer=None):  # fmt: skip
        self.tokenizer = tokenizer or FakeTokenizer()
        self.model_info = ModelInfo("fake-model", "Fake Model", 128, VOCAB, "fp_fake")
        self.fail_at, self.die_at, self.error_at, self.gate = fail_at, die_at, error_at, gate
        self.dead_at = None  # step that raises EngineDeadError (the engine's own fatal error)
        self.schedulable = schedulable
        self.requests: dict[str, dict] = {}
        self.pending: list[RequestOutput] = []
        self.steps = 0
        self.calls = 0  # has_unfinished_requests calls: how often the loop looked for work
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params, arrival_time=None, stream=False):
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
        if not ids:
            raise InvalidRequest(
                "prompt", "the prompt is empty: it must contain at least one token"
            )
        metrics = RequestMetrics(arrival_time=arrival_time or time.monotonic())
        self.requests[request_id] = dict(ids=list(ids), out=[], max=params.max_tokens, m=metrics)

    def abort_request(self, request_id):
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.aborted.append((request_id, len(req["out"])))
            self.pending.append(self._output(request_id, req, "abort"))
        return req is not None

    def has_unfinished_requests(self):
        self.calls += 1
        return bool(self.requests or self.pending)

    def step(self):
        outputs, self.pending = self.pending, []
        if not self.requests or not self.schedulable:
            return outputs
        if isinstance(self.gate, threading.Event):
            self.gate.wait()
        elif self.gate is not None:
            self.gate.acquire()  # a Semaphore: the test hands out steps one by one
        self.steps += 1
        if self.steps == self.die_at:
            raise Fatal("the loop itself broke")
        if self.steps == self.dead_at:
            raise EngineDeadError("tensor-parallel worker exited: inferd-tp-rank1 (exit code -9)")
        if self.steps == self.fail_at:
            raise RuntimeError("kernel exploded")
        for rid, req in list(self.requests.items()):
            req["out"].append(5)
            now = time.monotonic()
            m = req["m"]
            m.first_scheduled_time = m.first_scheduled_time or now
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            m.num_generation_tokens += 1
            done = len(req["out"]) >= req["max"]
            error = "RuntimeError: device lost" if self.steps == self.error_at else None
            if done or error:
                del self.requests[rid]
                m.finished_time = now
            outputs.append(self._output(rid, req, "length" if done else None, error))
        return outputs

    def _output(self, rid, req, reason, error=None):
        sample = CompletionOutput(0, "x" * len(req["out"]), list(req["out"]),
                                  finish_reason="error" if error else reason)  # fmt: skip
        finished = reason is not None or error is not None
        return RequestOutput(rid, None, req["ids"], [sample], finished, metrics=req["m"],
                             error=error)  # fmt: skip

    def stats(self):
        return EngineStats(len(self.requests), 0, 0.0, 0, 0, 0, 0, 0, self.steps)


def params(max_tokens=3):
    from inferd.sampling_params import SamplingParams

    return SamplingParams(max_tokens=max_tokens)


async def run_request(engine: AsyncEngine, rid: str, max_tokens=3) -> list:
    q: asyncio.Queue = asyncio.Queue()
    await engine.add_request(rid, {"prompt_token_ids": [1, 2]}, params(max_tokens), q)
    items = []
    while True:
        item = await asyncio.wait_for(q.get(), 5)
        items.append(item)
        if isinstance(item, BaseException) or item.finished:
            return items


def with_engine(fake: FakeEngine, body, **kwargs):
    async def main():
        engine = AsyncEngine(fake, **kwargs)
        engine.start()
        try:
            return await body(engine)
        finally:
            engine.stop(5)

    return asyncio.run(main())


def test_a_raising_step_fails_its_requests_and_the_loop_serves_on():
    async def body(engine):
        failed = await run_request(engine, "a")
        ok = await run_request(engine, "b")
        return failed, ok, engine.health()

    failed, ok, health = with_engine(FakeEngine(fail_at=1), body)
    assert isinstance(failed[-1], RequestFailed) and "kernel exploded" in str(failed[-1])
    assert ok[-1].finished and ok[-1].outputs[0].token_ids == [5, 5, 5]
    assert health is None


def test_invalid_request_raises_to_the_caller_and_queues_nothing():
    fake = FakeEngine()

    async def body(engine):
        with pytest.raises(ValueError, match="prompt is empty"):
            await engine.add_request("bad", {"prompt_token_ids": []}, params(), asyncio.Queue())
        return await run_request(engine, "good")

    assert with_engine(fake, body)[-1].finished
    assert "bad" not in fake.requests


def test_a_dead_loop_errors_in_flight_and_new_requests_and_fails_health():
    async def body(engine):
        in_flight = await run_request(engine, "a")
        await asyncio.sleep(0.05)
        with pytest.raises(EngineDeadError):
            await engine.add_request("b", {"prompt_token_ids": [1]}, params(), asyncio.Queue())
        return in_flight, engine.health()

    in_flight, health = with_engine(FakeEngine(die_at=2), body)
    assert isinstance(in_flight[-1], EngineDeadError)
    assert health is not None and "Fatal" in health


def test_an_engine_that_reports_itself_dead_ends_the_loop_and_fails_health():
    """The engine raises EngineDeadError when it cannot run another step (a tensor-parallel
    worker died): not a per-request failure, so the loop stops and /health goes red."""

    async def body(engine):
        in_flight = await run_request(engine, "a")
        await asyncio.sleep(0.05)
        return in_flight, engine.health()

    fake = FakeEngine()
    fake.dead_at = 2
    in_flight, health = with_engine(fake, body)
    assert isinstance(in_flight[-1], EngineDeadError)
    assert health is not None and "worker exited" in health


def test_a_stalled_loop_fails_health_until_it_moves_again():
    gate = threading.Event()

    async def body(engine):
        assert engine.health() is None
        task = asyncio.ensure_future(run_request(engine, "a", max_tokens=1))
        await asyncio.sleep(0.5)
        stalled = engine.health()
        gate.set()
        await task
        return stalled, engine.health()

    stalled, after = with_engine(FakeEngine(gate=gate), body, stall_timeout=0.2)
    assert stalled is not None and "no progress" in stalled
    assert after is None


def test_abort_reaches_the_engine_before_the_next_step():
    steps = threading.Semaphore(1)
    fake = FakeEngine(gate=steps)

    async def body(engine):
        q: asyncio.Queue = asyncio.Queue()
        await engine.add_request("long", {"prompt_token_ids": [1]}, params(1000), q)
        first = await q.get()
        engine.abort("long")
        # The loop may already be inside the next step (waiting for its permit); that step
        # may finish, but the abort must land before the one after it.
        steps.release()
        steps.release()
        await asyncio.sleep(0.2)
        return first

    first = with_engine(fake, body)
    assert first.outputs[0].token_ids == [5]
    [(rid, tokens)] = fake.aborted
    assert rid == "long" and tokens in (1, 2) and not fake.requests


def test_idle_loop_blocks_and_a_stuck_queue_does_not_spin():
    idle = FakeEngine()
    stuck = FakeEngine(schedulable=False)

    async def watch(engine):
        await asyncio.sleep(0.05)
        before = engine.engine.calls
        if engine.engine is stuck:
            await engine.add_request("w", {"prompt_token_ids": [1]}, params(), asyncio.Queue())
        await asyncio.sleep(0.3)
        return engine.engine.calls - before

    assert with_engine(idle, watch) <= 2
    assert with_engine(stuck, watch) < 300  # a 5 ms nap per try, not hundreds of thousands


def test_free_memory_is_handed_back_once_after_work_never_while_idle():
    """glibc's malloc_trim runs when the loop goes idle after steps, not on every wake-up."""
    trims: list[int] = []

    async def main():
        engine = AsyncEngine(FakeEngine())
        engine.core.loop._trim = lambda pad: trims.append(pad) or 1
        engine.start()
        try:
            await asyncio.sleep(0.05)
            assert trims == []  # idle from the start: nothing to hand back
            await run_request(engine, "a")
            await asyncio.sleep(0.1)
            assert trims == [0]
            engine.abort("nobody")  # a wake-up without a step
            await asyncio.sleep(0.1)
            assert trims == [0]
        finally:
            engine.stop(5)

    asyncio.run(main())


# ---- through HTTP (in-process app, fake engine) ------------------------------------------------
def sse_payloads(response) -> list:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("fault", [dict(fail_at=2), dict(error_at=2), dict(die_at=2)])
def test_error_after_stream_start_is_an_event_then_done(fault):
    app = create_app(AsyncEngine(FakeEngine(**fault)), ServerSettings())
    body = {"prompt": "hello", "max_tokens": 5, "stream": True}
    with TestClient(app) as client:
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = sse_payloads(r)
        assert events[-1] == "[DONE]"
        assert json.loads(events[0])["choices"][0]["text"] == "x"  # the stream did start
        error = json.loads(events[-2])["error"]
        assert error["message"] and error["type"] == "server_error"
        health = client.get("/health").status_code
        follow_up = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    if "die_at" in fault:
        assert health == 503 and follow_up.status_code == 503
        assert follow_up.json()["error"]["code"] == "engine_unavailable"
    else:
        assert health == 200 and follow_up.status_code == 200


def test_engine_failure_without_stream_is_a_500_not_a_hang():
    app = create_app(AsyncEngine(FakeEngine(fail_at=1)), ServerSettings())
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
        assert client.post("/generate", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_a_model_without_chat_template_gets_400_naming_the_flag():
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    from inferd.tokenizer import Tokenizer

    backend = Backend(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    app = create_app(AsyncEngine(FakeEngine(tokenizer=Tokenizer(backend))), ServerSettings())
    with TestClient(app) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        assert "--chat-template" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "messages"
        ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200  # plain completions still work
