"""Chat content given as a list of parts: each template's content format is read from its code,
text parts are joined for templates that want strings, and parts that are neither text nor
images are a 400 naming the part and its type (issue 27, item 1). No model: templates and a
scripted engine."""

from __future__ import annotations

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient
from tiny_models import train_tokenizer

from inferd.server.app import create_app
from inferd.tokenizer import Tokenizer
from inferd.tokenizer.chat_template import ChatTemplate
from inferd.tokenizer.content_format import PARTS, STRING, flatten_text_parts
from inferd.tokenizer.template_files import TEMPLATES_DIR

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PARTS_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endif %}{% endfor %}"
)
TWO_PARTS = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]  # fmt: skip


@pytest.mark.parametrize(
    "source, expected",
    [
        (CHATML, STRING),
        (PARTS_TEMPLATE, PARTS),
        ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
         PARTS),
        ("{% for m in messages %}{% set c = m['content'] %}{% for p in c | list %}{{ p.text }}"
         "{% endfor %}{% endfor %}", PARTS),
        ("{% for m in messages %}{% for r in m['tool_calls'] %}{{ r }}{% endfor %}"
         "{{ m['content'] }}{% endfor %}", STRING),
    ],
)  # fmt: skip
def test_the_content_format_is_read_from_the_template(source, expected):
    assert ChatTemplate(source).content_format == expected


def test_bundled_templates_take_strings_and_handle_parts_too():
    for name in ("gemma.jinja", "chatml_tools.jinja", "gemma_tools.jinja"):
        assert ChatTemplate((TEMPLATES_DIR / name).read_text()).content_format == STRING


def test_a_string_template_gets_the_text_parts_joined():
    rendered = ChatTemplate(CHATML).render(flatten_text_parts(TWO_PARTS), True)
    assert rendered == "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"


def test_flattening_refuses_a_part_that_is_not_text():
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\].*'image_url'"):
        flatten_text_parts(messages)


def test_a_tokenizer_renders_parts_with_either_kind_of_template(tmp_path):
    train_tokenizer(tmp_path)
    for template, text in [(CHATML, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"),
                           (PARTS_TEMPLATE, "<a><b>")]:  # fmt: skip
        tok = Tokenizer.from_hf_dir(tmp_path, chat_template=template)
        assert tok.chat_prompt(TWO_PARTS)[0] == text


@pytest.fixture
def http():
    with TestClient(create_app(ScriptedClient())) as client:
        yield client


@pytest.mark.parametrize("kind", ["input_audio", "file"])  # image_url: test_image_parts.py
def test_the_server_refuses_parts_that_are_not_text_naming_their_type(http, kind):
    content = [{"type": "text", "text": "look"}, {"type": kind, kind: {"url": "x"}}]
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": content}]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].content[1].type"
    assert repr(kind) in error["message"]


def test_a_text_part_without_text_is_a_400(http):
    body = {"messages": [{"role": "user", "content": [{"type": "text"}]}]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].text"


def test_text_parts_reach_the_template_as_parts(http):
    fake = http.app.state.inferd.client
    r = http.post("/v1/chat/completions", json={"messages": TWO_PARTS})
    assert r.status_code == 200, r.text
    assert fake.tokenizer.last_call["messages"][0]["content"] == TWO_PARTS[0]["content"]
