"""A client that leaves costs nothing (issue 27, item 8). On a scripted engine, through the raw
ASGI interface so that the client can vanish at a chosen moment: while its request is being
added (the engine has not taken it yet) and while it waits in the engine's queue, the route is
cancelled, its engine request aborted, and its admission given back at once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fake_client import ScriptedClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.generation.serving import CLIENT_GONE

BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 5},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/generate": {"prompt": "hi"},
}


class StuckClient(ScriptedClient):
    """An engine that takes requests but never steps (`hang_in_add`: never even takes them)."""

    def __init__(self, hang_in_add: bool):
        super().__init__()
        self.hang_in_add = hang_in_add
        self.added: list[str] = []
        self.aborted: list[str] = []

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        self.added.append(request_id)
        if self.hang_in_add:
            await asyncio.Event().wait()  # the verdict never comes

    def abort(self, request_id):
        self.aborted.append(request_id)


async def call_then_leave(app, path: str, leave_after_s: float) -> tuple[list[dict], float]:
    """POST `path` and disconnect after `leave_after_s`; (ASGI messages sent, seconds)."""
    body = json.dumps(BODIES[path]).encode()
    sent: list[dict] = []
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(leave_after_s)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "app": app}  # fmt: skip
    start = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent, time.monotonic() - start


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("hang_in_add", [True, False], ids=["while-added", "while-queued"])
def test_a_client_that_leaves_has_its_request_aborted_at_once(path, hang_in_add):
    fake = StuckClient(hang_in_add)
    app = create_app(fake, ServerSettings())
    sent, seconds = asyncio.run(call_then_leave(app, path, leave_after_s=0.2))
    assert sent[0]["status"] == CLIENT_GONE
    assert seconds < 2
    assert fake.added and fake.aborted == fake.added
    admission = app.state.inferd.admission
    assert not admission.live and admission.queued_requests == 0


def test_a_client_that_stays_gets_its_answer():
    app = create_app(ScriptedClient(), ServerSettings())
    sent, _ = asyncio.run(call_then_leave(app, "/v1/completions", leave_after_s=5))
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert json.loads(body)["choices"][0]["text"] == "hello"
