"""The embedded Gemma tokenizer, rebuilt by inferd from the GGUF vocabulary, must give exactly
the ids and text of HF transformers' conversion of the same file."""

from __future__ import annotations

import pytest

TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It wasn't me, they'd said; O'Neil's car!",
    "Ça déborde: naïve façade, Zürich, São Paulo, Øresund, ĳ, ß, ﬁ ligature",
    "日本語のテキストと中文文本，还有한국어 문장。",
    "مرحبا بالعالم، هذا نص عربي.",
    "हिन्दी में एक वाक्य। नमस्ते दुनिया",
    "emoji 😀🎉 and ZWJ 👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 flags 🇫🇷🇯🇵 and 🫠",
    "rare letters 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u0000 \u200b\ufeff",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs\n\nnewlines\n\n\n\nmany\r\nwindows",
    "a  b   c    d     e" + " " * 40 + "f",
    "\n\n  \t \n",
    "def f(x):\n    if x > 0:\n        return [i ** 2 for i in range(x)]\n    return None\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text with <eos> inside and <pad> <unk> <mask> [multimodal] <unused17>",
    "almost special: <start_of_turn <end_of_turn>> </div> <div>",
    "Numbers: 0 1 12 123 1234 3.14159 -42 1e10 1,000,000 ٣٤٥ ４２",
    "URL https://example.com/a/b?c=d&e=f#g and email someone@example.org",
    "Mixed: naïve café 🍵 in 東京 at 10:30am — “quotes” ‘single’ … ellipsis",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_hf(gemma_tokenizer, hf_gemma_tokenizer, text):
    expected = hf_gemma_tokenizer(text)["input_ids"]
    assert gemma_tokenizer.encode(text) == expected
    assert expected[0] == 2  # HF adds BOS for this file: the comparison covers that policy too
    plain = hf_gemma_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert gemma_tokenizer.encode(text, add_special_tokens=False) == plain


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_hf(gemma_tokenizer, hf_gemma_tokenizer, text):
    ids = hf_gemma_tokenizer(text)["input_ids"]
    for skip in (False, True):
        expected = hf_gemma_tokenizer.decode(ids, skip_special_tokens=skip)
        assert gemma_tokenizer.decode(ids, skip_special_tokens=skip) == expected
    assert gemma_tokenizer.convert_ids_to_tokens(ids) == hf_gemma_tokenizer.convert_ids_to_tokens(
        ids
    )


def test_every_vocabulary_entry_encodes_like_hf(gemma_tokenizer, hf_gemma_tokenizer):
    # Each token's own text exercises its merges; this is what would catch a wrong or missing
    # merge (including one dropped by inferd's dead-merge pruning).
    hf_backend = hf_gemma_tokenizer.backend_tokenizer
    vocab = sorted(hf_backend.get_vocab().items(), key=lambda item: item[1])
    texts = [token.replace("\u2581", " ") for token, _ in vocab]
    ours = gemma_tokenizer.backend.encode_batch(texts, add_special_tokens=False)
    theirs = hf_backend.encode_batch(texts, add_special_tokens=False)
    mismatches = [t for t, a, b in zip(texts, ours, theirs, strict=True) if a.ids != b.ids]
    assert mismatches == []


def test_long_document_matches_hf(gemma_tokenizer, hf_gemma_tokenizer):
    text = "\n".join(TEXTS) * 20
    assert gemma_tokenizer.encode(text) == hf_gemma_tokenizer(text)["input_ids"]


def test_vocabulary_and_special_ids(gemma_tokenizer, hf_gemma_tokenizer):
    assert gemma_tokenizer.vocab_size == len(hf_gemma_tokenizer) == 262144
    assert gemma_tokenizer.bos_token_id == hf_gemma_tokenizer.bos_token_id == 2
    assert gemma_tokenizer.eos_token_id == hf_gemma_tokenizer.eos_token_id == 1
    assert gemma_tokenizer.pad_token_id == hf_gemma_tokenizer.pad_token_id == 0
    assert gemma_tokenizer.token_to_id("<end_of_turn>") == 106
    assert gemma_tokenizer.eos_token_ids == (1, 106)
    assert gemma_tokenizer.special_tokens == {
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"
    }  # fmt: skip
    hf_special = {i for i, t in hf_gemma_tokenizer.added_tokens_decoder.items() if t.special}
    assert set(gemma_tokenizer.all_special_ids) == hf_special
    assert {0, 1, 2, 3, 4, 105, 106} <= hf_special


def test_chat_prompt_tokens(gemma_tokenizer):
    ids = gemma_tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [2, 105, gemma_tokenizer.token_to_id("user")]  # one BOS, not two
    assert ids[-3:] == [105, gemma_tokenizer.token_to_id("model"), 107]
