"""Profiling a real `inferd serve` on the embedded model (its default, fastest mode: the GGUF
blocks and inferd's C kernels): the step and request histograms after one request, a trace
taken through /start_profile and /stop_profile, and a request's own timeline."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import start_server

from inferd.step_timing import STEP_KINDS, STEP_PHASES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def http(traces):
    server = start_server("--dtype", "auto", "--profiler-dir", str(traces),
                          "--enable-request-timeline")  # fmt: skip
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            yield client
    finally:
        server.stop()


def samples(text: str, name: str) -> dict[str, float]:
    """{label string: value} of one metric's samples."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def one(text: str, name: str, **labels: str) -> float:
    found = [v for k, v in samples(text, name).items()
             if all(f'{a}="{b}"' in k for a, b in labels.items())]  # fmt: skip
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_step_and_request_histograms_after_one_request(http):
    r = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 5,
                                           "temperature": 0, "ignore_eos": True})  # fmt: skip
    assert r.status_code == 200
    text = http.get("/metrics").text
    steps = 0
    for kind in STEP_KINDS:
        count = one(text, "inferd:step_duration_seconds_count", step_kind=kind)
        total = one(text, "inferd:step_duration_seconds_sum", step_kind=kind)
        phases = [one(text, "inferd:step_phase_seconds_sum", step_kind=kind, phase=p)
                  for p in STEP_PHASES]  # fmt: skip
        for p in STEP_PHASES:
            assert one(text, "inferd:step_phase_seconds_count", step_kind=kind, phase=p) == count
        assert sum(phases) <= total * (1 + 1e-6), (kind, phases, total)
        steps += count
    # One prefill step, then a decode step per further token.
    assert one(text, "inferd:step_duration_seconds_count", step_kind="prefill") == 1
    assert steps == 5 and one(text, "inferd:iteration_tokens_total_count") == 5
    assert one(text, "inferd:step_phase_seconds_sum", step_kind="decode", phase="forward") > 0
    parts = [one(text, f"inferd:request_{p}_time_seconds_sum") for p in ("queue", "prefill",
                                                                          "decode")]  # fmt: skip
    assert sum(parts) <= one(text, "inferd:e2e_request_latency_seconds_sum")
    assert one(text, "inferd:request_inference_time_seconds_sum") <= one(
        text, "inferd:e2e_request_latency_seconds_sum")  # fmt: skip
    for name in ("request_prompt_tokens", "request_generation_tokens", "request_params_max_tokens",
                 "request_queue_time_seconds", "e2e_request_latency_seconds"):  # fmt: skip
        assert one(text, f"inferd:{name}_count") == 1, name
    assert one(text, "inferd:request_generation_tokens_sum") == 5
    assert one(text, "inferd:request_params_max_tokens_sum") == 5


def test_profile_routes_write_a_trace_naming_the_engine_phases(http):
    assert http.post("/start_profile").status_code == 200
    assert http.post("/start_profile").status_code == 409  # one trace at a time
    r = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3,
                                           "temperature": 0, "ignore_eos": True})  # fmt: skip
    assert r.status_code == 200
    stopped = http.post("/stop_profile")
    assert stopped.status_code == 200
    files = stopped.json()
    assert files["steps"] == 3
    with open(files["trace"]) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    phases = {"inferd.step", *(f"inferd.{p}" for p in STEP_PHASES)}
    assert phases | {"layer.0", "layer.17", "lm_head"} <= names
    # Decode steps run every layer as one C call; products and norms are C kernels too.
    assert {"inferd_decode_layer", "inferd_block_gemv"} <= names
    with open(files["ops_table"]) as f:
        assert "inferd_decode_layer" in f.read()
    assert http.post("/stop_profile").status_code == 409


def test_a_request_returns_its_timeline(http):
    messages = [{"role": "user", "content": "Name a colour. " * 12}]  # > one KV block
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "return_timeline": True}
    first = http.post("/v1/chat/completions", json=body).json()["timeline"][0]
    events = [e["event"] for e in first["events"]]
    assert events == ["arrived", "queued", "scheduled", "first_token", "finished"]
    times = [e["t"] for e in first["events"]]
    assert times == sorted(times) and times[0] == 0.0
    assert first["queue_s"] + first["prefill_s"] + first["decode_s"] <= first["e2e_s"]
    assert first["generation_tokens"] == 4 and first["preemptions"] == 0
    again = http.post("/v1/chat/completions", json=body).json()["timeline"][0]
    assert again["cached_prompt_tokens"] >= 16  # the prompt's full blocks, from the cache
    assert again["prompt_tokens"] == first["prompt_tokens"]


def test_bench_serve_profile_traces_the_run_on_the_server(http, traces, capsys):
    from inferd import cli

    before = set(traces.glob("*.trace.json"))
    code = cli.main(["bench", "serve", "--base-url", str(http.base_url).rstrip("/"),
                     "--num-prompts", "2", "--input-len", "8", "--output-len", "2",
                     "--profile"])  # fmt: skip
    assert code == 0
    assert "the server's trace:" in capsys.readouterr().out
    (new,) = set(traces.glob("*.trace.json")) - before
    names = {e.get("name") for e in json.loads(new.read_text())["traceEvents"]}
    assert "inferd.step" in names


def test_bench_serve_multiturn_starts_conversations_at_the_request_rate(http, capsys):
    from inferd import cli

    base = ["bench", "serve", "--base-url", str(http.base_url).rstrip("/"), "--preset",
            "multiturn", "--num-prompts", "2", "--input-len", "8", "--output-len", "2"]  # fmt: skip
    assert cli.main([*base, "--request-rate", "20"]) == 0
    out = capsys.readouterr().out
    assert "2 of 6 turns, starting at 20/s" in out
    assert "12" in out.split("Successful requests", 1)[1].splitlines()[0]
    assert cli.main([*base, "--max-concurrency", "1"]) == 2
    assert "drop --max-concurrency" in capsys.readouterr().err
