"""Streaming detokenization on the embedded Gemma tokenizer: the deltas must add up to the full
decode, and no delta may show a half-finished character."""

from __future__ import annotations

import random

import pytest

from inferd.loader.gguf_file import GGUFFile
from inferd.tokenizer import IncrementalDetokenizer, Tokenizer
from inferd.tokenizer.detokenizer import CONTEXT_TOKENS, MAX_PENDING_TOKENS, MAX_WINDOW_TOKENS

FFFD = "\ufffd"
TEXTS = [
    "Hello world, plain ASCII prose with punctuation!",
    "emoji 😀🎉 ZWJ 👩‍👩‍👧‍👦 👨🏽‍💻 flags 🇫🇷 and 🫠",
    "日本語のテキスト，中文文本，한국어 문장",
    "byte fallback: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 then text",  # letters missing from the vocab: <0xNN> runs
    "  spaces,\ttabs\n\nand newlines   ",
    "def f(x):\n    return x ** 2\n",
]


@pytest.fixture(scope="module")
def tok(gemma_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(gemma_gguf))


def _stream(tok, prompt, output, chunk=1, skip=True):
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = [detok.step(output[i : i + chunk]) for i in range(0, len(output), chunk)]
    deltas.append(detok.flush())
    return deltas, detok


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_stream_equals_full_decode(tok, text, chunk):
    prompt = tok.encode("Question: what next?")
    output = tok.encode(text, add_special_tokens=False)
    deltas, detok = _stream(tok, prompt, output, chunk)
    assert "".join(deltas) == detok.text == tok.decode(output) == text
    assert not any(FFFD in d for d in deltas)


def test_byte_fallback_character_is_held_until_complete(tok):
    output = tok.encode("𝔘!", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(output)
    assert pieces[:4] == ["<0xF0>", "<0x9D>", "<0x94>", "<0x98>"]  # the premise of the test
    detok = IncrementalDetokenizer(tok, tok.encode("x"))
    # Even the complete 4th byte is held: a following byte could still invalidate the run.
    assert [detok.step([i]) for i in output[:4]] == ["", "", "", ""]
    assert detok.step(output[4:]) == "𝔘!"
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.step([i]) for i in output[:4]] == ["", "", "", ""]
    assert detok.flush() == "𝔘" and detok.text == "𝔘"


def test_invalid_bytes_stream_as_the_full_decode_shows_them(tok):
    byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in (0x80, 0xC3, 0xA9, 0xF0, 0x9D)}
    word = tok.encode("word", add_special_tokens=False)
    cases = [
        [byte[0xC3], byte[0xA9], *word],  # "é" by bytes
        [byte[0xC3], byte[0xA9], byte[0x80], *word],  # a stray byte spoils the whole run
        [*word, byte[0x80], *word],
        [*word, byte[0xF0], byte[0x9D]],  # cut off mid-character at the end
    ]
    for output in cases:
        full = tok.decode(output)
        deltas, _ = _stream(tok, tok.encode("p"), output)
        assert "".join(deltas) == full
        for delta in deltas[:-1]:  # before flush, U+FFFD only where the full decode has it
            assert FFFD not in delta or FFFD in full
    assert FFFD * 3 in tok.decode(cases[1])  # the retroactive effect is real


def test_skip_special_tokens(tok):
    output = tok.encode("Hi there", add_special_tokens=False) + [106, 1]
    deltas, detok = _stream(tok, tok.encode("p"), output, skip=True)
    assert detok.text == "Hi there" == tok.decode(output)
    deltas, detok = _stream(tok, tok.encode("p"), output, skip=False)
    assert detok.text == "Hi there<end_of_turn><eos>" == tok.decode(output, False)
    assert deltas[-2:] in (["<eos>", ""], ["", "<eos>"])


def test_prompt_ending_mid_character(tok):
    f0, x9d = tok.token_to_id("<0xF0>"), tok.token_to_id("<0x9D>")
    prompt = [*tok.encode("abc"), f0, x9d]
    output = [tok.token_to_id("<0x94>"), tok.token_to_id("<0x98>"), *tok.encode(" ok", False)]
    deltas, detok = _stream(tok, prompt, output)
    assert detok.text == tok.decode(output)  # the output alone, as decode() sees it
    assert not any(FFFD in d for d in deltas[:-2])


def test_step_cost_does_not_grow_with_length(tok, monkeypatch):
    widths = []
    decode = tok.decode

    def spy(ids, skip_special_tokens=True):
        widths.append(len(ids))
        return decode(ids, skip_special_tokens)

    monkeypatch.setattr(tok, "decode", spy)
    text = " ".join(TEXTS) * 10
    output = tok.encode(text, add_special_tokens=False)
    assert len(output) > 1000
    deltas, detok = _stream(tok, tok.encode("p"), output)
    assert detok.text == text
    # A bounded window (some tokens of context plus what is pending), never the history.
    assert max(widths) <= MAX_WINDOW_TOKENS + 8
    # About one decode per token: an emitted window is the next one's context, its text known.
    assert len(widths) < 1.2 * len(output)
    # Hundreds of invisible (skipped) tokens still keep the window bounded.
    widths.clear()
    detok = IncrementalDetokenizer(tok, [])
    assert all(detok.step([106]) == "" for _ in range(300))
    assert detok.step(tok.encode("ok", False)) == "ok"
    assert max(widths) <= CONTEXT_TOKENS + MAX_PENDING_TOKENS + 1


@pytest.mark.parametrize("skip", [True, False])
def test_random_streams_with_bytes_and_special_tokens(tok, skip):
    # Adversarial streams: 30% byte-fallback tokens (valid and invalid UTF-8, runs interrupted
    # by special tokens, which vanish when skipped so the bytes around them join up), 10%
    # special tokens, random chunk sizes and prompts. Exact equality must still hold.
    byte_ids, special_ids = sorted(tok.byte_fallback_ids), list(tok.all_special_ids)
    for seed in range(100):
        rng = random.Random(seed)
        output = []
        for _ in range(120):
            x = rng.random()
            pool = byte_ids if x < 0.3 else special_ids if x < 0.4 else None
            output.append(rng.choice(pool) if pool else rng.randrange(tok.vocab_size))
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(8))]
        detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        i, deltas = 0, []
        while i < len(output):
            n = rng.randint(1, 4)
            deltas.append(detok.step(output[i : i + n]))
            i += n
        deltas.append(detok.flush())
        assert "".join(deltas) == tok.decode(output, skip_special_tokens=skip), seed


def test_detokenizers_share_the_tokenizer_special_id_set(tok):
    # One frozenset per tokenizer, not a copy per sequence (Gemma: 6,249 ids, ~0.5 MB each).
    first = IncrementalDetokenizer(tok, [2])
    second = IncrementalDetokenizer(tok, [2, 9259])
    assert first._hidden is second._hidden is tok.special_ids
    assert len(tok.special_ids) == len(tok.all_special_ids) == 6249
    assert IncrementalDetokenizer(tok, [2], skip_special_tokens=False)._hidden == frozenset()
