"""The Batch API (/v1/files, /v1/batches) with the official `openai` client, in process on a
scripted engine: a batch's lines run through their routes (a malformed line and a line the
route refuses fail alone, in the error file with their custom_id), cancel abandons the lines in
flight, the limits answer 413 / 400, and the sweep deletes expired files."""

from __future__ import annotations

import json
import os
import stat
import time
from contextlib import contextmanager

import httpx
import pytest
from fake_client import ScriptedClient
from openai import OpenAI
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.batches.file_store import FileStore
from inferd.server.batches.settings import BATCH_PRIORITY, BatchSettings

KEY = "sk-batch"
HI = [{"role": "user", "content": "hi"}]


class InProcess(httpx.BaseTransport):
    """The client's transport: each request goes to the app through the test client, whose
    event loop keeps running the batches between requests."""

    def __init__(self, http: TestClient):
        self.http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.http.request(request.method, request.url.path, params=request.url.params,
                              headers=dict(request.headers), content=request.read())  # fmt: skip
        return httpx.Response(r.status_code, headers=dict(r.headers), content=r.content)


class StuckClient(ScriptedClient):
    """An engine that takes requests and never answers: the lines stay in flight."""

    def __init__(self):
        super().__init__()
        self.aborted: list[str] = []

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        self.requests.append((request_id, dict(prompt), params))

    def abort(self, request_id):
        self.aborted.append(request_id)


@contextmanager
def served(tmp_path, fake=None, **batch):
    fake = fake or ScriptedClient(lambda ids, params, k: "hello")
    settings = ServerSettings(api_key=KEY, batch=BatchSettings(files_dir=str(tmp_path), **batch))
    with TestClient(create_app(fake, settings)) as http:
        transport = httpx.Client(transport=InProcess(http), base_url="http://testserver/v1")
        yield OpenAI(api_key=KEY, base_url="http://testserver/v1", http_client=transport,
                     max_retries=0), fake, http  # fmt: skip


def jsonl(*lines) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def chat_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake-model", "messages": HI, "max_tokens": 3, **body}}  # fmt: skip


def wait_done(sdk: OpenAI, batch_id: str):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = sdk.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.02)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def test_batch_runs_each_line_through_its_route_and_a_bad_line_fails_alone(tmp_path):
    with served(tmp_path, priority=BATCH_PRIORITY) as (sdk, fake, _):
        data = jsonl(chat_line("a"), b'{"custom_id": "broken", ', chat_line("b", temperature=-1),
                     chat_line("c"), chat_line("d"))  # fmt: skip
        up = sdk.files.create(file=("in.jsonl", data), purpose="batch")
        assert (up.bytes, up.filename, up.purpose) == (len(data), "in.jsonl", "batch")
        assert stat.S_IMODE(os.stat(tmp_path / up.id).st_mode) == 0o600
        batch = sdk.batches.create(input_file_id=up.id, endpoint="/v1/chat/completions",
                                   completion_window="24h", metadata={"job": "t"})  # fmt: skip
        assert batch.status == "validating" and batch.request_counts.total == 5
        done = wait_done(sdk, batch.id)
        assert done.status == "completed" and done.metadata == {"job": "t"}
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 2)
        assert done.in_progress_at and done.finalizing_at and done.completed_at
        out = [json.loads(x) for x in sdk.files.content(done.output_file_id).text.splitlines()]
        assert [o["custom_id"] for o in out] == ["a", "c", "d"]
        reply = out[0]["response"]
        assert reply["status_code"] == 200 and reply["body"]["object"] == "chat.completion"
        assert reply["body"]["choices"][0]["message"]["content"] == "hel"  # max_tokens honoured
        errors = [json.loads(x) for x in sdk.files.content(done.error_file_id).text.splitlines()]
        assert (
            errors[0]["custom_id"] is None
            and "line 2 is not valid JSON" in (errors[0]["error"]["message"])
        )
        assert errors[1]["custom_id"] == "b" and errors[1]["response"]["status_code"] == 400
        assert errors[1]["response"]["body"]["error"]["param"] == "temperature"
        # Every line reached the engine at the batch priority (the server runs `priority`).
        assert [p["priority"] for _, p, _ in fake.requests] == [BATCH_PRIORITY] * 3
        assert sdk.batches.list().data[0].id == batch.id
        listed = sdk.files.list(purpose="batch_output")
        assert {f.id for f in listed.data} == {done.output_file_id, done.error_file_id}
        assert sdk.files.delete(up.id).deleted
        with pytest.raises(Exception, match="404"):
            sdk.files.retrieve(up.id)


def test_cancel_abandons_the_lines_in_flight(tmp_path):
    fake = StuckClient()
    with served(tmp_path, fake, concurrency=2) as (sdk, _, _):
        up = sdk.files.create(file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(5)))),
                              purpose="batch")  # fmt: skip
        batch = sdk.batches.create(input_file_id=up.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        deadline = time.monotonic() + 5
        while len(fake.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert len(fake.requests) == 2  # --batch-concurrency 2: the others wait
        assert sdk.batches.cancel(batch.id).status == "cancelling"
        done = wait_done(sdk, batch.id)
        assert done.status == "cancelled" and done.cancelled_at and done.output_file_id is None
        assert sorted(fake.aborted) == sorted(rid for rid, _, _ in fake.requests)
        assert len(fake.requests) == 2


def test_limits_and_refusals(tmp_path):
    with served(tmp_path, max_file_bytes=1000, max_batch_lines=2) as (sdk, _, http):
        assert http.get("/v1/files").status_code == 401  # no key
        with pytest.raises(Exception, match="413"):
            sdk.files.create(file=("big.jsonl", b"x" * 70_000), purpose="batch")
        with pytest.raises(Exception, match="--max-file-bytes"):
            sdk.files.create(file=("big.jsonl", b"x" * 1001), purpose="batch")
        with pytest.raises(Exception, match="purpose must be 'batch'"):
            sdk.files.create(file=("a.jsonl", b"{}"), purpose="fine-tune")
        up = sdk.files.create(file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(3)))),
                              purpose="batch")  # fmt: skip
        with pytest.raises(Exception, match="--max-batch-lines"):
            sdk.batches.create(input_file_id=up.id, endpoint="/v1/chat/completions",
                               completion_window="24h")  # fmt: skip
        with pytest.raises(Exception, match="endpoint must be one of"):
            sdk.batches.create(input_file_id=up.id, endpoint="/v1/responses",
                               completion_window="24h")  # fmt: skip
        with pytest.raises(Exception, match="404"):
            sdk.batches.create(input_file_id="file-" + "0" * 24, endpoint="/v1/completions",
                               completion_window="24h")  # fmt: skip


def test_sweep_deletes_expired_files_and_dead_writers_leftovers(tmp_path):
    store = FileStore(tmp_path / "files")
    kept = store.create(b"a", "a.jsonl", "batch", "", expires_in_s=7200)
    gone = store.create(b"b", "b.jsonl", "batch", "", expires_in_s=3600)
    assert stat.S_IMODE(os.stat(store.dir).st_mode) == 0o700
    orphan = store.dir / ("file-" + "1" * 24)
    orphan.write_bytes(b"half")  # content whose writer died before its metadata
    now = time.time()
    assert store.sweep(now + 60) == 0  # nothing expired; the orphan may be a writer at work
    assert store.sweep(now + 3601) == 2  # `gone`, and the orphan (an hour old by then)
    assert store.get(gone.id, "") is None and not gone.path.exists() and not orphan.exists()
    assert store.get(kept.id, "", now=now) is not None
    assert store.get(kept.id, "", now=now + 7201) is None  # expired reads as gone before a sweep
