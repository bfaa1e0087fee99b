"""The cases of issue 16 against a real `inferd serve` with small limits (conftest.py): each is
answered quickly with the right status, /health answers within 1 s throughout, the process
stays up, and the KV cache returns to where it was (the `watch` fixture checks the last three).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

WORDS = "lorem ipsum dolor sit amet " * 400_000  # 10.8 MB of text


def post(http: httpx.Client, path: str, body: dict | bytes) -> tuple[httpx.Response, float]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    start = time.monotonic()
    r = http.post(path, content=content, headers={"Content-Type": "application/json"})
    return r, time.monotonic() - start


def test_a_hundred_thousand_prompts_in_one_request_are_refused_at_once(limited_http, watch):
    r, seconds = post(limited_http, "/v1/completions",
                      {"prompt": [[2, 818]] * 100_000, "max_tokens": 1})  # fmt: skip
    assert r.status_code == 400, r.text
    assert "--max-prompts-per-request" in r.json()["error"]["message"]
    assert seconds < 5


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_ten_mib_prompt_is_refused_by_its_bytes_without_encoding(limited_http, watch, route):
    text = WORDS[: 10 << 20]
    body = {"prompt": text} if route == "/v1/completions" else {
        "messages": [{"role": "user", "content": text}]}  # fmt: skip
    r, seconds = post(limited_http, route, {**body, "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and "bytes of text" in error["message"]
    assert seconds < 5  # encoding it would take seconds of one core


def test_encoding_megabytes_does_not_freeze_the_server(limited_http, watch):
    """/tokenize has no context limit: 4 MiB are encoded (seconds of one core), while /health
    and the event loop go on (the encode runs without holding Python's lock)."""
    r, _ = post(limited_http, "/tokenize", {"prompt": WORDS[: 4 << 20]})
    assert r.status_code == 200 and r.json()["count"] > 500_000
    assert len(watch.latencies) >= 3  # probed while it ran


def test_min_tokens_beyond_the_context_is_a_400(limited_http, watch):
    chat = {"messages": [{"role": "user", "content": "Hi"}], "min_tokens": 100_000}
    for path, body in [("/v1/chat/completions", chat),
                       ("/v1/completions", {"prompt": "Hi", "min_tokens": 100_000,
                                            "max_tokens": None})]:  # fmt: skip
        r, _ = post(limited_http, path, body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "min_tokens"


def _stream_first_line(url: str, i: int, results: list, release: threading.Event) -> None:
    body = {"prompt": f"Story {i}:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, timeout=120) as c:
        start = time.monotonic()
        with c.stream("POST", "/v1/completions", json=body) as r:
            # NOTE: the status line goes out once the request is admitted and queued in the
            # engine, before any token (the one that waits has no seat yet).
            results.append((r.status_code, time.monotonic() - start, r.headers))
            release.wait(120)


def test_a_burst_fills_the_free_seats_and_only_the_excess_waits(limited_server, watch):
    """8 sequence slots and --max-queued-requests 1: of 12 simultaneous streams, 9 are taken
    (8 start, 1 waits) and 3 refused with 503 and Retry-After, at once."""
    results: list = []
    release = threading.Event()
    threads = [threading.Thread(target=_stream_first_line,
                                args=(limited_server.url, i, results, release))
               for i in range(12)]  # fmt: skip
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(results) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    release.set()  # the streams close: their requests are aborted
    for t in threads:
        t.join(60)
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 9 + [503] * 3, statuses
    refused = [(seconds, headers) for status, seconds, headers in results if status == 503]
    assert all(int(h["Retry-After"]) >= 1 for _, h in refused)
    assert max(seconds for seconds, _ in refused) < 5  # not after an engine step


BAD_BODIES = {
    "lone surrogate in the prompt": ("/v1/completions", b'{"prompt": "a\\ud800b"}'),
    "lone surrogate in a stop string": ("/v1/completions", b'{"prompt": "a", "stop": ["\\udc00"]}'),
    "lone surrogate in chat content": (
        "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}'),
    "lone surrogate to /tokenize": ("/tokenize", b'{"prompt": "\\ud800"}'),
    "CESU-8 bytes": ("/v1/completions", b'{"prompt": "a\xed\xa0\x80b"}'),
    "Latin-1 bytes": ("/v1/completions", b'{"prompt": "caf\xe9"}'),
    "JSON nested 100000 deep": ("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"}"),
    "chat_template_kwargs self": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"self": 1}}'),
    "chat_template_kwargs tokenize": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a"}], '
        b'"chat_template_kwargs": {"tokenize": true}}'),
    "empty cache_salt": ("/v1/completions", b'{"prompt": "a", "cache_salt": ""}'),
}  # fmt: skip


def test_bad_input_is_a_400_and_costs_one_log_line(limited_server, limited_http, watch):
    log_before = limited_server.log.read_text(errors="replace")
    for name, (path, body) in BAD_BODIES.items():
        r, _ = post(limited_http, path, body)
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["message"], name
    time.sleep(0.5)
    new_lines = limited_server.log.read_text(errors="replace")[len(log_before) :].splitlines()
    assert "Traceback" not in "\n".join(new_lines)
    requests_logged = [line for line in new_lines if '" 400 ' in line]
    assert len(requests_logged) == len(BAD_BODIES)
    # the access line, and at most the /health probes and /metrics reads: nothing else
    assert all("inferd.access" in line for line in new_lines), new_lines


def _generate(http: httpx.Client, prompt: list[int], salt: str | None) -> int:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["timings"]["cached_prompt_tokens"]


def test_cache_salt_keeps_tenants_apart_and_lets_one_tenant_reuse(limited_http, watch):
    prompt = [2] + [(7919 * i) % 200_000 + 1000 for i in range(80)]  # unique to this test
    assert _generate(limited_http, prompt, "tenant-a") == 0
    assert _generate(limited_http, prompt, "tenant-a") >= 64  # its own blocks: a hit
    assert _generate(limited_http, prompt, "tenant-b") == 0  # another tenant's: none
    assert _generate(limited_http, prompt, None) == 0  # no salt: none either
    assert _generate(limited_http, prompt, None) >= 64
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "cache_salt": "a"}
    assert limited_http.post("/v1/chat/completions", json=chat).status_code == 200


def test_a_long_prefill_shares_steps_with_a_running_stream(limited_server, limited_http, watch):
    """--max-num-batched-tokens 64: a 900-token prompt is prefilled in ~15 chunks, and a
    running stream gets a token in each of those steps, never waiting for the whole prefill."""
    arrivals: list[float] = []
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True,
                "stream": True}  # fmt: skip
        with httpx.Client(base_url=limited_server.url, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.monotonic())
                        if len(arrivals) == 5:
                            started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    sent = time.monotonic()
    long_prompt = {"prompt": [2] + [818] * 900, "max_tokens": 1, "stream": True}
    with limited_http.stream("POST", "/v1/completions", json=long_prompt) as r:
        next(line for line in r.iter_lines() if line.startswith("data: {"))
        first_token = time.monotonic()
    reader.join(120)
    during = [t for t in arrivals if sent <= t <= first_token]
    assert len(during) >= 10, len(during)  # ~15 prefill steps, one token each
    gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
    assert max(gaps) < (first_token - sent) / 4  # bounded by a chunk, not by the prefill
