"""Images in chat messages on the server, without a model (a scripted engine): an `image_url`
part with a base64 data: URL reaches the engine decoded, its place in the message an
`{"type": "image"}` part for the template; what the server cannot read is a 400 naming the
part and what was wrong. (Through a real model: tests/parity/test_vision_engine.py.)"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.errors import InvalidRequest
from inferd.server.app import create_app


def _data_url(fmt: str = "PNG", size: tuple[int, int] = (12, 9)) -> str:
    from PIL import Image

    pixels = np.random.RandomState(0).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()


def _chat(url: str) -> dict:
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4}


@pytest.fixture
def http():
    with TestClient(create_app(ScriptedClient())) as client:
        yield client


def test_an_image_part_reaches_the_engine_decoded(http):
    fake = http.app.state.inferd.client
    r = http.post("/v1/chat/completions", json=_chat(_data_url()))
    assert r.status_code == 200, r.text
    _, prompt, _ = fake.last
    [image] = prompt["multi_modal_data"]["image"]
    assert image.size == (12, 9) and image.mode == "RGB"
    content = fake.tokenizer.last_call["messages"][0]["content"]
    assert content == [{"type": "text", "text": "what is this?"}, {"type": "image"}]


@pytest.mark.parametrize(
    "url, wanted",
    [
        ("https://example.com/cat.png", "not fetched by this server"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:text/plain;base64,aGk=", "'text/plain' is not an image"),
        ("data:image/png,rawbytes", "only base64 data: URLs"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(),
         "cannot be decoded"),
        (_data_url("TIFF"), "unsupported image format TIFF"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_is_a_400_naming_the_part(http, url, wanted):
    r = http.post("/v1/chat/completions", json=_chat(url))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url"
    assert wanted in error["message"]


def test_a_decompression_bomb_is_a_400(http, monkeypatch):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    r = http.post("/v1/chat/completions", json=_chat(_data_url(size=(40, 30))))
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"], r.text


def test_anthropic_image_blocks_and_responses_input_images_reach_the_engine(http):
    fake = http.app.state.inferd.client
    b64 = _data_url().split(",", 1)[1]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    content = [{"type": "text", "text": "what is this?"}, block]
    messages = [{"role": "user", "content": content}]
    r = http.post("/v1/messages", json={"max_tokens": 4, "messages": messages})
    assert r.status_code == 200, r.text
    assert [i.size for i in fake.last[1]["multi_modal_data"]["image"]] == [(12, 9)]

    parts = [{"type": "input_text", "text": "what is this?"},
             {"type": "input_image", "image_url": _data_url(size=(5, 7))}]  # fmt: skip
    r = http.post("/v1/responses", json={"input": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    assert [i.size for i in fake.last[1]["multi_modal_data"]["image"]] == [(5, 7)]
    content = fake.tokenizer.last_call["messages"][-1]["content"]
    assert content == [{"type": "text", "text": "what is this?"}, {"type": "image"}]


def test_an_anthropic_url_source_is_refused(http):
    block = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    messages = [{"role": "user", "content": [block]}]
    r = http.post("/v1/messages", json={"max_tokens": 4, "messages": messages})
    assert r.status_code == 400 and "fetches no URLs" in r.json()["error"]["message"], r.text


def test_the_engines_image_refusals_name_the_messages(http):
    # the engine refuses (a text-only model, more than --limit-mm-per-prompt) naming its own
    # field; the chat routes name the messages the images came from
    fake = http.app.state.inferd.client
    original = fake.add_request

    async def refuse(request_id, prompt, params, outputs, arrival_time=None):
        if "multi_modal_data" in prompt:
            raise InvalidRequest("multi_modal_data.image", "this model reads text only")
        return await original(request_id, prompt, params, outputs, arrival_time)

    fake.add_request = refuse
    r = http.post("/v1/chat/completions", json=_chat(_data_url()))
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {**r.json()["error"], "param": "messages",
                                 "message": "this model reads text only"}  # fmt: skip


@pytest.fixture
def image_host():
    """A local HTTP server with one PNG at /cat.png (anything else: 404)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = base64.b64decode(_data_url(size=(7, 5)).split(",", 1)[1])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/cat.png" else 404)
            self.end_headers()
            if self.path == "/cat.png":
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_image_urls_are_fetched_from_listed_hosts_only(image_host):
    from inferd.server.app import ServerSettings
    from inferd.server.http.api_settings import APISettings

    settings = ServerSettings(api=APISettings(allowed_media_domains=("127.0.0.1",)))
    fake = ScriptedClient()
    with TestClient(create_app(fake, settings)) as http:
        r = http.post("/v1/chat/completions", json=_chat(f"{image_host}/cat.png"))
        assert r.status_code == 200, r.text
        assert [i.size for i in fake.last[1]["multi_modal_data"]["image"]] == [(7, 5)]
        r = http.post("/v1/chat/completions", json=_chat(f"{image_host}/dog.png"))
        assert r.status_code == 400 and "answered HTTP 404" in r.json()["error"]["message"]
        other = image_host.replace("127.0.0.1", "localhost")  # the same server, not listed
        r = http.post("/v1/chat/completions", json=_chat(f"{other}/cat.png"))
        assert r.status_code == 400 and "--allowed-media-domains" in r.json()["error"]["message"]
