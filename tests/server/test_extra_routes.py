"""/generate, /tokenize, /detokenize, /version, /health and the /metrics names, on a real server."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

METRIC_NAMES = [
    "inferd:num_requests_running", "inferd:num_requests_waiting", "inferd:kv_cache_usage_perc",
    "inferd:prompt_tokens_total", "inferd:generation_tokens_total",
    "inferd:request_success_total", "inferd:num_preemptions_total",
    "inferd:prefix_cache_queries_total", "inferd:prefix_cache_hits_total",
    "inferd:time_to_first_token_seconds_bucket", "inferd:inter_token_latency_seconds_bucket",
    "inferd:e2e_request_latency_seconds_bucket", "inferd:request_queue_time_seconds_bucket",
    "inferd:request_prefill_time_seconds_bucket", "inferd:request_decode_time_seconds_bucket",
]  # fmt: skip


def test_generate_returns_text_counts_and_timings(http, client, model_name):
    r = http.post("/generate", json={"prompt": "The sky is", "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["completion_tokens"] == len(body["token_ids"]) == 6
    assert body["finish_reason"] == "length" and body["text"]
    assert (
        body["prompt_tokens"]
        == http.post("/tokenize", json={"prompt": "The sky is"}).json()["count"]
    )
    t = body["timings"]
    assert 0 <= t["queue_s"] <= t["ttft_s"] <= t["e2e_s"]
    assert t["tokens_per_s"] > 0 and t["decode_s"] > 0
    same = client.completions.create(model=model_name, prompt="The sky is", max_tokens=6,
                                     temperature=0)  # fmt: skip
    assert same.choices[0].text == body["text"]


def test_tokenize_detokenize_round_trip(http):
    ids = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] > 0
    no_bos = http.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False})
    assert len(no_bos.json()["tokens"]) == ids["count"] - 1
    back = http.post("/detokenize", json={"tokens": ids["tokens"]}).json()
    assert back["prompt"] == "Hello world"


def test_version_health_and_metric_names(http):
    assert http.get("/version").json()["version"]
    assert http.get("/health").status_code == 200
    text = http.get("/metrics").text
    missing = [name for name in METRIC_NAMES if name not in text]
    assert not missing
    assert 'model_name="' in text
