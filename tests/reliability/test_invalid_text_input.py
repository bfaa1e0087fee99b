"""Text that is not valid Unicode (a lone surrogate, as JSON's "\\ud800" escape or leniently
decoded CESU-8 gives) never crashes the tokenizer: it is a ValueError (HTTP 400) naming where
the bad code point is, whether it comes as a prompt, chat content or a template variable."""

from __future__ import annotations

import re

import pytest
from tiny_models import train_tokenizer

from inferd.tokenizer import Tokenizer

CESU_8_EMOJI = b"\xed\xa0\xbd\xed\xb8\x80"  # U+1F600 as two 3-byte surrogates (CESU-8)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    train_tokenizer(folder)
    return Tokenizer.from_hf_dir(folder)


@pytest.mark.parametrize(
    ("text", "code_point", "index"),
    [
        ("a\ud800b", "U+D800", 1),
        ("\udfff", "U+DFFF", 0),
        (CESU_8_EMOJI.decode("utf-8", "surrogatepass"), "U+D83D", 0),
        ("ok 😀 then \udc00", "U+DC00", 10),
    ],
)
def test_encode_refuses_surrogates_with_a_clear_value_error(tok, text, code_point, index):
    for split in (False, True):
        with pytest.raises(
            ValueError, match=re.escape(f"surrogate {code_point} at character {index}")
        ):
            tok.encode(text, split_special_tokens=split)


def test_chat_names_the_message_part_or_variable(tok):
    cases = [
        ([{"role": "user", "content": "a\ud800"}], {}, "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}],
            {},
            "messages[0].content[0].text",
        ),  # fmt: skip
        ([{"role": "user\ud800", "content": "x"}], {}, "messages[0].role"),
        ([{"role": "user", "content": "x"}], {"tools": [{"name": "f\ud800"}]}, "tools[0].name"),
    ]
    for messages, kwargs, where in cases:
        for call in (tok.encode_chat, tok.apply_chat_template, tok.chat_prompt):
            with pytest.raises(ValueError, match=f"^{re.escape(where)}: invalid Unicode"):
                call(messages, chat_template_kwargs=kwargs)


def test_valid_text_is_untouched(tok):
    text = "emoji 😀, astral 𝔘, ascii"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.encode_chat([{"role": "user", "content": text}])


def test_not_a_string_is_a_value_error(tok):
    with pytest.raises(ValueError, match="must be a string, got bytes"):
        tok.encode(b"raw bytes")  # type: ignore[arg-type]
