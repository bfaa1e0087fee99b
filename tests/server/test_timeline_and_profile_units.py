"""Request timelines, the request and step histograms, and the profiling routes, without a model:
a fake engine client behind the real app (milliseconds)."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import pytest
from starlette.testclient import TestClient

from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine.scheduling.step import ModelRunnerOutput
from inferd.engine_client import EngineStats, ModelInfo, ProfilerStateError, TraceFiles
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferd.profiling.step_timer import StepTimer
from inferd.sampling_params import SamplingParams
from inferd.server.app import ServerSettings, create_app
from inferd.server.metrics.prometheus import ServerMetrics, token_buckets
from inferd.server.metrics.timeline import log_timeline, timeline_json


def metrics_of(arrival=10.0, queued=10.1, scheduled=10.3, first=10.8, last=11.6, finished=11.7,
               preempted=(11.0,)) -> RequestMetrics:  # fmt: skip
    return RequestMetrics(arrival_time=arrival, queued_time=queued, first_scheduled_time=scheduled,
                          first_token_time=first, last_token_time=last, finished_time=finished,
                          preemption_times=preempted, num_preemptions=len(preempted),
                          num_cached_tokens=16, num_generation_tokens=9,
                          max_tokens_param=9)  # fmt: skip


def output(rid="r-0", m=None, n=9) -> RequestOutput:
    m = m or metrics_of()
    return RequestOutput(rid, None, list(range(20)), [CompletionOutput(0, "x" * n, [5] * n,
                                                                        finish_reason="length")],
                         True, metrics=m)  # fmt: skip


def sample(text: str, line_start: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(line_start))
    return float(line.rsplit(" ", 1)[1])


# ---- the timeline ------------------------------------------------------------------------------
def test_timeline_orders_events_and_gives_vllm_intervals():
    m = metrics_of()
    assert [e for e, _ in m.timeline()] == ["arrived", "queued", "scheduled", "first_token",
                                            "preempted", "finished"]  # fmt: skip
    assert dict(m.timeline())["preempted"] == pytest.approx(1.0)
    assert m.queue_time == pytest.approx(0.2)  # queued → scheduled, not arrival → scheduled
    assert m.prefill_time == pytest.approx(0.5) and m.decode_time == pytest.approx(0.8)
    assert m.inference_time == pytest.approx(m.prefill_time + m.decode_time)
    assert m.queue_time + m.prefill_time + m.decode_time <= m.e2e_latency
    body = timeline_json(output(m=m))
    assert body["events"][0] == {"event": "arrived", "t": 0.0}
    assert (body["cached_prompt_tokens"], body["preemptions"], body["prompt_tokens"]) == (16, 1, 20)
    assert body["e2e_s"] == pytest.approx(1.7)
    assert RequestMetrics(arrival_time=1.0).timeline() == [("arrived", 0.0)]


def test_the_scheduler_stamps_queued_preempted_and_max_tokens():
    kv = KVCacheManager([None], [7], 4, True)  # 6 usable blocks of 4 tokens
    sched = Scheduler(kv, 8, 64, 256, (1,), b"root")
    reqs = []
    for i in range(2):
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        req = Request(f"r{i}", [i + 2] * 12, params, RequestMetrics(0.0), 8, forked=True)
        req.sequences = [Sequence(i, req, 0, [i + 2] * 12, 12)]
        sched.add_request(req)
        reqs.append(req)
    assert all(r.metrics.queued_time > 0 and r.metrics.max_tokens_param == 8 for r in reqs)
    for _ in range(2):  # 3 blocks each fill the pool; the older one's 4th block preempts
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput([[7] for _ in out.sample_ids]))
    newer = reqs[1].metrics
    assert newer.num_preemptions == len(newer.preemption_times) == 1
    assert newer.preemption_times[0] >= newer.first_scheduled_time
    assert "preempted" in dict(newer.timeline())


def test_log_timeline_at_debug_only(caplog):
    with caplog.at_level(logging.INFO, logger="inferd.timeline"):
        log_timeline(output())
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger="inferd.timeline"):
        log_timeline(output())
    assert "r-0: arrived 0.0 ms" in caplog.text and "(16 cached)" in caplog.text


# ---- histograms --------------------------------------------------------------------------------
def test_request_histograms_follow_vllm_and_stay_consistent():
    metrics = ServerMetrics("m", max_model_len=1000)
    metrics.observe_output(output())
    text = metrics.render().decode()
    queue = sample(text, "inferd:request_queue_time_seconds_sum")
    prefill = sample(text, "inferd:request_prefill_time_seconds_sum")
    decode = sample(text, "inferd:request_decode_time_seconds_sum")
    assert queue + prefill + decode <= sample(text, "inferd:e2e_request_latency_seconds_sum")
    assert math.isclose(sample(text, "inferd:request_inference_time_seconds_sum"), 1.3)
    assert sample(text, "inferd:request_prompt_tokens_sum") == 20
    assert sample(text, "inferd:request_generation_tokens_sum") == 9
    assert sample(text, "inferd:request_params_max_tokens_count") == 1
    assert 'inferd:request_prompt_tokens_bucket{le="20.0",model_name="m"} 1.0' in text
    assert token_buckets(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def test_step_histograms_render_from_the_engine_snapshot(monkeypatch):
    from inferd.profiling import step_timer

    now = [0.0]
    monkeypatch.setattr(step_timer, "perf_counter", lambda: now[0])
    timer = StepTimer()
    for phase_seconds, tokens, prefill in ((0.004, 32, False), (0.2, 300, True)):
        timer.start()
        for phase in ("prepare", "forward", "sample", "output"):
            timer.begin(phase)
            now[0] += phase_seconds
        timer.finish(tokens, prefill)
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 2, step_timing=timer.snapshot())
    metrics = ServerMetrics("m")
    assert "step_phase_seconds" not in metrics.render().decode()  # no engine timings yet
    text = metrics.render(stats).decode()
    decode = '{engine="0",model_name="m",phase="forward",step_kind="decode"}'
    assert sample(text, "inferd:step_phase_seconds_count" + decode) == 1
    assert sample(text, "inferd:step_phase_seconds_sum" + decode) == pytest.approx(0.004)
    prefill = '{engine="0",model_name="m",step_kind="prefill"}'
    assert sample(text, "inferd:step_duration_seconds_sum" + prefill) == pytest.approx(0.8)
    assert sample(text, "inferd:iteration_tokens_total_count") == 2
    assert sample(text, "inferd:iteration_tokens_total_sum") == 332
    assert 'inferd:iteration_tokens_total_bucket{engine="0",le="32.0",model_name="m"} 1.0' in text


# ---- the app with a fake client ----------------------------------------------------------------
class FakeClient:
    """Answers every request with one finished output; can be 'profiled'."""

    model_info = ModelInfo("fake", "Fake", 1000, 100, "fp_fake")

    class tokenizer:  # noqa: N801 - the attribute the app reads
        @staticmethod
        def encode(text, add_special_tokens=True):
            return [1, 2, 3]

        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return "x" * len(ids)

        @staticmethod
        def convert_ids_to_tokens(ids):
            return ["x" for _ in ids]

        @staticmethod
        def apply_chat_template(messages, add_generation_prompt=True, **kwargs):
            return "hi"

        @staticmethod
        def chat_prompt(messages, add_generation_prompt=True, **kwargs):
            return "hi", [1, 2, 3]

    def __init__(self) -> None:
        self.tracing = False
        self.observers = []

    def start(self):
        pass

    def stop(self, timeout=30.0):
        pass

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        out = output(request_id)
        for observe in self.observers:
            observe(out)
        asyncio.get_running_loop().call_soon(outputs.put_nowait, out)

    def abort(self, request_id):
        pass

    def health(self):
        return None

    def stats(self):
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)

    def observe_outputs(self, callback):
        self.observers.append(callback)

    async def start_profile(self, directory):
        if self.tracing:
            raise ProfilerStateError("a trace is already running; stop it first")
        self.tracing = directory

    async def stop_profile(self):
        if not self.tracing:
            raise ProfilerStateError("no trace is running; start one first")
        self.tracing = False
        return TraceFiles("/t/x.trace.json", "/t/x.ops.txt", 3, "table")


def test_profile_routes_exist_only_with_a_profiler_dir():
    with TestClient(create_app(FakeClient())) as http:
        assert http.post("/start_profile").status_code == 404
    client = FakeClient()
    with TestClient(create_app(client, ServerSettings(profiler_dir="/tmp/p"))) as http:
        assert http.post("/stop_profile").status_code == 409
        assert http.post("/start_profile").status_code == 200 and client.tracing == "/tmp/p"
        busy = http.post("/start_profile")
        assert busy.status_code == 409 and "already running" in busy.json()["error"]["message"]
        stopped = http.post("/stop_profile")
        assert stopped.json() == {"trace": "/t/x.trace.json", "ops_table": "/t/x.ops.txt",
                                  "steps": 3}  # fmt: skip


def test_a_client_that_cannot_profile_is_refused_at_start():
    plain = type("PlainClient", (), {k: v for k, v in vars(FakeClient).items()
                                     if not k.endswith("_profile")})  # fmt: skip
    with pytest.raises(ValueError, match="--profiler-dir"):
        create_app(plain(), ServerSettings(profiler_dir="/tmp/p"))


def test_return_timeline_is_refused_unless_enabled():
    with TestClient(create_app(FakeClient())) as http:
        for path, body in (("/v1/completions", {"prompt": "hi"}), ("/generate", {"prompt": "hi"}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}]})):  # fmt: skip
            r = http.post(path, json={**body, "return_timeline": True})
            assert r.status_code == 400, path
            assert r.json()["error"]["param"] == "return_timeline"
            assert "--enable-request-timeline" in r.json()["error"]["message"]
        assert "timeline" not in http.post("/v1/completions", json={"prompt": "hi"}).json()


def test_return_timeline_in_every_route_and_the_stream():
    app = create_app(FakeClient(), ServerSettings(enable_request_timeline=True))
    with TestClient(app) as http:
        body = http.post("/v1/completions", json={"prompt": ["a", "b"], "return_timeline": True})
        timeline = body.json()["timeline"]
        assert [t["request_id"][-2:] for t in timeline] == ["-0", "-1"]  # one per prompt
        assert timeline[0]["events"][-1]["event"] == "finished"
        chat = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "return_timeline": True},
        )
        assert chat.json()["timeline"][0]["cached_prompt_tokens"] == 16
        gen = http.post("/generate", json={"prompt": "hi", "return_timeline": True}).json()
        assert gen["timeline"]["preemptions"] == 1 and gen["timings"]
        stream = http.post("/v1/completions", json={"prompt": "hi", "stream": True,
                                                    "return_timeline": True})  # fmt: skip
        chunks = [json.loads(ln[6:]) for ln in stream.text.splitlines()
                  if ln.startswith("data: {")]  # fmt: skip
        assert chunks[-1]["choices"] == [] and chunks[-1]["timeline"][0]["generation_tokens"] == 9
        assert all("timeline" not in c for c in chunks[:-1])
