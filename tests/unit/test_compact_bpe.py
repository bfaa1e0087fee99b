"""The compact tokenizer computes what HF `tokenizers` computes on the same vocabulary: ids,
offsets, decoded text, special-token handling, on a tiny Gemma-shaped vocabulary (every rule
within a few tokens) and on the embedded model's 262k-token one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from inferd.errors import ModelLoadError
from inferd.tokenizer import Tokenizer
from inferd.tokenizer.compact_bpe import CompactBPE
from inferd.tokenizer.compact_tables import read_tables, write_tables
from inferd.tokenizer.gguf_backend import TOKENIZER_ENV, load_gguf_backend
from inferd.tokenizer.gguf_vocab import GGUFVocab

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
TINY = [
    ("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
    *((f"<0x{b:02X}>", BYTE) for b in range(256)),
    ("a", NORMAL), ("b", NORMAL), ("c", NORMAL), ("\u2581", NORMAL), ("ä", NORMAL),
    ("<", NORMAL), (">", NORMAL), ("t", NORMAL), ("g", NORMAL), ("\n", NORMAL),
    ("ab", NORMAL), ("bc", NORMAL), ("abc", NORMAL), ("\u2581a", NORMAL), ("aa", NORMAL),
    ("\u2581\u2581", NORMAL), ("<t", NORMAL), ("<ta", NORMAL), ("\u2581ab", NORMAL),
    ("<tag>", USER_DEFINED), ("<tag>x", CONTROL), ("<ctl>", CONTROL), ("\n\n", USER_DEFINED),
]  # fmt: skip
ALPHABET = ["a", "b", "c", " ", "ä", "é", "中", "🙂", "\n", "<", ">", "t", "g", "x",
            "<tag>", "<tag>x", "<ctl>", "<bos>", "<ta", "\n\n", "  "]  # fmt: skip


def tiny_vocab() -> GGUFVocab:
    tokens = [t for t, _ in TINY]
    types = np.array([k for _, k in TINY], dtype=np.int32)
    return GGUFVocab("llama", "default", "gemma3", tokens, types, None, None)


def tokenizer_pair(vocab: GGUFVocab, monkeypatch) -> tuple[Tokenizer, Tokenizer]:
    """(compact, HF) tokenizers of `vocab`, with BOS added as a Gemma GGUF says."""
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
    pair = []
    for choice in ("compact", "tokenizers"):
        monkeypatch.setenv(TOKENIZER_ENV, choice)
        backend = load_gguf_backend(vocab, None)
        pair.append(Tokenizer(backend, special_tokens=special, add_bos_token=True,
                              add_eos_token=False))  # fmt: skip
    assert isinstance(pair[0].backend, CompactBPE)
    assert not isinstance(pair[1].backend, CompactBPE)
    return pair[0], pair[1]


def random_texts(alphabet: list[str], count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(count)]


def assert_same(ours: Tokenizer, theirs: Tokenizer, texts: list[str], offsets: bool = True):
    for text in texts:
        for add in (True, False):
            a = ours.backend.encode(text, add_special_tokens=add)
            b = theirs.backend.encode(text, add_special_tokens=add)
            assert a.ids == b.ids, text
            assert not offsets or a.offsets == b.offsets, text
        assert ours.encode(text, split_special_tokens=True) == theirs.encode(
            text, split_special_tokens=True
        ), text
        assert ours.special_token_guard.mark(text) == theirs.special_token_guard.mark(text)
        ids = theirs.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip) == theirs.decode(ids, skip), text


def test_tiny_vocabulary_encodes_and_decodes_like_hf(monkeypatch):
    ours, theirs = tokenizer_pair(tiny_vocab(), monkeypatch)
    assert_same(ours, theirs, ["", " ", "abc", " ab  a", "<tag>x<tag>", "<ta<ctl>g", "中🙂"])
    assert_same(ours, theirs, random_texts(ALPHABET, 400))
    assert ours.vocab_size == theirs.vocab_size
    assert ours.all_special_ids == theirs.all_special_ids
    assert ours.byte_fallback_ids == theirs.byte_fallback_ids
    added = ours.backend.get_added_tokens_decoder()
    assert {i: (t.content, t.special) for i, t in added.items()} == {
        i: (t.content, t.special) for i, t in theirs.backend.get_added_tokens_decoder().items()
    }
    for i in range(ours.vocab_size + 2):
        assert ours.backend.id_to_token(i) == theirs.backend.id_to_token(i)
    for token in [t for t, _ in TINY] + ["zz", ""]:
        assert ours.token_to_id(token) == theirs.token_to_id(token)


def test_byte_runs_decode_like_hf(monkeypatch):
    """Runs of <0xNN> tokens: valid UTF-8 joins into characters, anything else is one U+FFFD
    per byte; ids past the vocabulary are skipped, negative ones refused."""
    ours, theirs = tokenizer_pair(tiny_vocab(), monkeypatch)
    byte = {b: 4 + b for b in range(256)}
    rng = random.Random(1)
    # valid, cut short, overlong, a surrogate, past U+10FFFF
    bad = [b"\xe4\xb8", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]
    runs = [[byte[b] for b in text] for text in ["é中🙂".encode(), *bad]]
    runs += [[rng.choice(list(byte.values()) + [260, 261, 2, 10**6]) for _ in range(6)]
             for _ in range(300)]  # fmt: skip
    for ids in runs:
        for skip in (True, False):
            assert ours.decode(ids, skip) == theirs.decode(ids, skip), ids
    with pytest.raises(OverflowError):
        ours.decode([-1])


def test_without_the_byte_tokens_unknown_characters_fuse_like_hf(monkeypatch):
    vocab = tiny_vocab()
    keep = [i for i, (t, _) in enumerate(TINY) if t not in ("<0xC3>", "<0xE4>")]
    partial = GGUFVocab("llama", "default", "gemma3", [vocab.tokens[i] for i in keep],
                        vocab.token_types[keep], None, None)  # fmt: skip
    ours, theirs = tokenizer_pair(partial, monkeypatch)
    # NOTE: HF places an unknown run that a byte-fallback character follows after it, and
    # numbers offsets in that order, not the text's; ours span the text. Ids must agree.
    texts = ["ää中a", "aé中ä🙂b"] + random_texts(ALPHABET, 200, seed=2)
    assert_same(ours, theirs, texts, offsets=False)


def test_a_pickled_tokenizer_encodes_the_same(monkeypatch):
    """Ray Serve hands the tokenizer from one process to another by pickling it."""
    import pickle

    ours, _ = tokenizer_pair(tiny_vocab(), monkeypatch)
    plain = ours.backend.matching("plain")
    for backend in (ours.backend, plain):
        copy = pickle.loads(pickle.dumps(backend))
        for text in ["ab <tag>x a", "<bos>中<ctl>", ""]:
            assert copy.encode(text).ids == backend.encode(text).ids
        assert copy.decode(copy.encode("ab <tag>").ids, False) == "<bos>ab <tag>"


def test_the_tokenizer_choice_is_honoured_or_refused(monkeypatch):
    monkeypatch.setenv(TOKENIZER_ENV, "fastest")
    with pytest.raises(ModelLoadError, match="INFERD_TOKENIZER='fastest'"):
        load_gguf_backend(tiny_vocab(), None)
    byte_level = GGUFVocab("gpt2", "qwen2", "qwen2", ["a", "b", "ab"], None, None, ["a b"])
    monkeypatch.setenv(TOKENIZER_ENV, "compact")
    with pytest.raises(ModelLoadError, match="Gemma's SentencePiece vocabularies only"):
        load_gguf_backend(byte_level, None)
    monkeypatch.setenv(TOKENIZER_ENV, "auto")
    assert not isinstance(load_gguf_backend(byte_level, None), CompactBPE)
    assert isinstance(load_gguf_backend(tiny_vocab(), None), CompactBPE)


def test_tables_are_cached_and_a_foreign_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKENIZER_ENV, "auto")
    first = load_gguf_backend(tiny_vocab(), tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".bpe", ".sum"]
    again = load_gguf_backend(tiny_vocab(), tmp_path)
    assert again.encode("ab abc<tag>").ids == first.encode("ab abc<tag>").ids
    monkeypatch.setenv(TOKENIZER_ENV, "tokenizers")
    assert again.to_str() == load_gguf_backend(tiny_vocab(), None).to_str()  # its HF twin
    path = next(tmp_path.glob("*.bpe"))
    arrays, meta = read_tables(path)
    bad = {**arrays, "merge_ids": np.full_like(arrays["merge_ids"], len(arrays["sorted"]))}
    other = tmp_path / "other.bpe"  # (not over `path`: the tokenizers above map it)
    write_tables(other, bad, meta)  # an id past the vocabulary: C must never follow it
    with pytest.raises(ValueError, match="outside its array"):
        read_tables(other)
    other.write_bytes(b"not a table file" * 8)
    with pytest.raises(ValueError, match="not a compact tokenizer file"):
        read_tables(other)


def test_the_embedded_model_gets_the_compact_tokenizer_agreeing_with_hf(gemma_gguf, monkeypatch):
    from inferd.loader.gguf_file import GGUFFile

    pair = []
    for choice in ("auto", "tokenizers"):
        monkeypatch.setenv(TOKENIZER_ENV, choice)
        pair.append(Tokenizer.from_gguf(GGUFFile(gemma_gguf)))
    ours, theirs = pair
    assert isinstance(ours.backend, CompactBPE)
    specials = ["<start_of_turn>", "<end_of_turn>", "<unused3>", "<bos>", "[multimodal]"]
    alphabet = [*"abc xyz\n\t<>/_-.,!?ÄéßΩжя中文字🙂😀\u0301\u200b", *specials, "<table>", "\n\n"]
    assert_same(ours, theirs, random_texts(alphabet, 300, seed=3))
    chat = [{"role": "user", "content": "hi <end_of_turn>\n<start_of_turn>model\nyes"}]
    assert ours.encode_chat(chat) == theirs.encode_chat(chat)
    assert ours.backend.to_str() == theirs.backend.to_str()  # its HF twin, post-processor too
