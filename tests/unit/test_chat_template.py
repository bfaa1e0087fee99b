"""Chat templates: sandboxing, error reporting, the bundled Gemma template, --chat-template."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models

from inferd.tokenizer import (
    ChatTemplate,
    Tokenizer,
    default_chat_template,
    load_chat_template,
    render_chat_template,
)

GEMMA = default_chat_template("gemma3")
CHAT = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": [{"type": "text", "text": "Bye"}, {"type": "image"}]},
]


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['os'] }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set ns = namespace(_secret=1) %}",
        "{{ messages.append(1) }}",
        "{{ dict.mro() }}",
    ],
)
def test_sandbox_refuses_internals(source):
    with pytest.raises(ValueError, match="chat template"):
        render_chat_template(source, [{"role": "user", "content": "x"}])


def test_sandbox_leaves_inputs_untouched():
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ValueError):
        render_chat_template("{% set _ = messages.pop() %}", messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_raise_exception_becomes_value_error_with_its_message():
    source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first!') }}{% endif %}"
    with pytest.raises(ValueError, match="rejected the messages: user first!"):
        render_chat_template(source, [{"role": "assistant", "content": "x"}])
    assert render_chat_template(source, [{"role": "user", "content": "x"}]) == ""


def test_syntax_and_runtime_errors_are_value_errors():
    with pytest.raises(ValueError, match="syntax error"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        render_chat_template("{{ 1 / 0 }}", [])
    with pytest.raises(ValueError, match="messages must be a list"):
        ChatTemplate("x").render("hello")  # type: ignore[arg-type]


def test_helpers_and_hf_conventions():
    source = (
        "{% for m in messages %}\n"  # trim_blocks: a newline after a block tag is dropped
        "  {{ m | tojson }}|{% generation %}{{ m['content'] }}{% endgeneration %}\n"
        "  {% if loop.first %}{% continue %}{% endif %}"  # lstrip_blocks: indent before it too
        "{{ strftime_now('%Y') | length }}\n"
        "{% endfor %}"
    )
    out = render_chat_template(source, [{"content": "é<&>"}, {"content": "b"}])
    # tojson keeps non-ASCII and HTML characters as they are (the model must see them).
    assert out == '  {"content": "é<&>"}|é<&>  {"content": "b"}|b4\n'
    assert render_chat_template("{{ x }}-{{ bos_token }}", [], x=1, bos_token="<s>") == "1-<s>"


def test_gemma_default_renders_the_documented_format():
    text = render_chat_template(GEMMA, CHAT, bos_token="<bos>")
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    no_prompt = render_chat_template(GEMMA, CHAT[1:2], False, bos_token="<bos>")
    assert no_prompt == "<bos><start_of_turn>user\nHi!<end_of_turn>\n"


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([{"role": "assistant", "content": "x"}], "alternate"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "alternate"),
        ([{"role": "tool", "content": "x"}], "role 'tool'"),
    ],
)
def test_gemma_default_rejects_other_shapes(messages, error):
    with pytest.raises(ValueError, match=error):
        render_chat_template(GEMMA, messages, bos_token="<bos>")


def test_default_templates_by_architecture():
    assert default_chat_template("gemma") == default_chat_template("gemma2") == GEMMA
    assert "<start_of_turn>" in GEMMA
    assert default_chat_template("llama") is None


def test_load_chat_template_from_file_or_inline(tmp_path):
    jinja_file = tmp_path / "t.jinja"
    jinja_file.write_text("{{ messages | length }}")
    assert load_chat_template(str(jinja_file)) == "{{ messages | length }}"
    json_file = tmp_path / "t.json"
    json_file.write_text(json.dumps({"chat_template": "{{ 7 }}"}))
    assert load_chat_template(str(json_file)) == "{{ 7 }}"
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert load_chat_template(inline) == inline
    with pytest.raises(ValueError, match="--chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    json_file.write_text("[]")
    with pytest.raises(ValueError, match="chat_template"):
        load_chat_template(str(json_file))


def test_tokenizer_without_template_names_the_flag():
    tok = Tokenizer(Backend(models.BPE()), special_tokens={"bos_token": None})
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="--chat-template") as info:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "chat_template argument" in str(info.value)
    tok.chat_template = "{{ messages[0]['content'] }}!"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


@pytest.mark.parametrize("name", ["self", "messages", "add_generation_prompt"])
def test_variables_named_like_render_arguments_are_value_errors(name):
    template = ChatTemplate("{{ messages | length }}")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=f"variable '{name}' .* is reserved"):
        template.render(messages, True, {name: 1})
    tok = Tokenizer(Backend(models.BPE()), chat_template="{{ messages | length }}")
    for call in (tok.apply_chat_template, tok.encode_chat, tok.chat_prompt):
        with pytest.raises(ValueError, match=f"variable '{name}'"):  # never a TypeError
            call(messages, chat_template_kwargs={name: 1})
    if name != "add_generation_prompt":  # a keyword argument of its own, as in HF
        with pytest.raises(ValueError, match=f"variable '{name}'"):
            tok.apply_chat_template(messages, **{name: 1})
        with pytest.raises(ValueError, match=f"variable '{name}'"):
            render_chat_template("{{ 1 }}", messages, **{name: 1})


def test_template_kwargs_reach_the_template_and_must_be_an_object():
    tok = Tokenizer(Backend(models.BPE()), chat_template="{{ greeting }} {{ name }}")
    messages = [{"role": "user", "content": "hi"}]
    out = tok.apply_chat_template(messages, chat_template_kwargs={"greeting": "hello"}, name="x")
    assert out == "hello x"
    with pytest.raises(ValueError, match="chat_template_kwargs must be an object"):
        tok.apply_chat_template(messages, chat_template_kwargs=["greeting"])  # type: ignore[arg-type]
