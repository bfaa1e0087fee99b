"""The conversation a harmony model (gpt-oss) is sent back, as its template reads it: an assistant's
reasoning under every name templates use, call arguments as objects, reasoning_effort as a
variable; and a harmony vocabulary stops at both of its reply ends."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models

from inferd.tokenizer.chat_template import render_chat_template
from inferd.tokenizer.tokenizer import Tokenizer
from inferd.tools.templates import prepare_messages

# Written for this test in the shape gpt-oss's template renders (its own is not bundled): the
# reasoning as `thinking`, the first call with its arguments as JSON, a tool result after it.
TEMPLATE = """<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.tool_calls -%}
<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>
{%- set call = m.tool_calls[0].function -%}
<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>
{{- call.arguments | tojson }}<|call|>
{%- elif m.role == 'tool' -%}
<|start|>functions.f to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- else -%}
<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

HISTORY = [
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Use the tool.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def test_a_tool_round_trip_renders_as_harmony():
    text = render_chat_template(TEMPLATE, prepare_messages(HISTORY), reasoning_effort="high")
    assert text == (
        "<|start|>system<|message|>Reasoning: high<|end|>"
        "<|start|>user<|message|>Weather?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|>"
        '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}<|call|>'
        '<|start|>functions.f to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant"
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_reaches_templates_under_every_name(field):
    [message] = prepare_messages([{"role": "assistant", "content": "hi", field: "why"}])
    assert message["reasoning_content"] == message["reasoning"] == message["thinking"] == "why"


def test_reasoning_given_twice_must_agree_and_be_text():
    same = {"role": "assistant", "content": "", "reasoning": "x", "reasoning_content": "x"}
    assert prepare_messages([same])[0]["thinking"] == "x"
    with pytest.raises(ValueError, match=r"messages\[0\]: reasoning_content, reasoning differ"):
        prepare_messages([{**same, "reasoning": "y"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.thinking must be a string"):
        prepare_messages([{"role": "assistant", "content": "", "thinking": 3}])
    user = {"role": "user", "content": "hi", "reasoning_content": "x"}
    assert prepare_messages([user]) == [user]  # only an assistant's reasoning is one


def test_a_harmony_vocabulary_stops_at_return_and_call():
    vocab = {"[UNK]": 0, "hi": 1}
    backend = Backend(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.add_special_tokens(["<|return|>", "<|channel|>", "<|call|>", "<|endoftext|>"])
    ids = {t: backend.token_to_id(t) for t in ("<|return|>", "<|call|>", "<|endoftext|>")}
    harmony = Tokenizer(backend, special_tokens={"eos_token": "<|endoftext|>"})
    assert set(harmony.eos_token_ids) == set(ids.values())
    plain = Backend(models.WordLevel(vocab, unk_token="[UNK]"))
    plain.add_special_tokens(["<|return|>", "<|call|>"])  # no channels: not harmony
    assert Tokenizer(plain, special_tokens={"eos_token": "<|return|>"}).eos_token_ids == (2,)
