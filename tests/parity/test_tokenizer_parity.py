"""The embedded Gemma tokenizer, rebuilt by inferd from the GGUF vocabulary, must give exactly
the ids and text of HF transformers' conversion of the same file (HF's answers are stored:
gemma_reference.py; scripts/gemma_hf_reference.py regenerates them)."""

from __future__ import annotations

import pytest
from gemma_reference import TOKENIZER_TEXTS, long_document, vocabulary_digest


@pytest.fixture(scope="module")
def hf(hf_gemma_reference):
    """HF's answers for the embedded model's tokenizer."""
    return hf_gemma_reference[0]["tokenizer"]


@pytest.mark.parametrize("i", range(len(TOKENIZER_TEXTS)))
def test_encode_matches_hf(gemma_tokenizer, hf, i):
    text, expected = TOKENIZER_TEXTS[i], hf["texts"][i]
    assert gemma_tokenizer.encode(text) == expected["ids"]
    assert expected["ids"][0] == 2  # HF adds BOS for this file: the comparison covers that policy
    assert gemma_tokenizer.encode(text, add_special_tokens=False) == expected["plain_ids"]


@pytest.mark.parametrize("i", range(len(TOKENIZER_TEXTS)))
def test_decode_matches_hf(gemma_tokenizer, hf, i):
    expected = hf["texts"][i]
    ids = expected["ids"]
    assert gemma_tokenizer.decode(ids, skip_special_tokens=False) == expected["decoded"]
    assert gemma_tokenizer.decode(ids, skip_special_tokens=True) == expected["decoded_skip_special"]
    assert gemma_tokenizer.convert_ids_to_tokens(ids) == expected["tokens"]


def test_every_vocabulary_entry_encodes_like_hf(gemma_tokenizer, hf):
    # Each token's own text exercises its merges; this is what would catch a wrong or missing
    # merge (including one dropped by inferd's dead-merge pruning).
    vocab = gemma_tokenizer.backend.get_vocab()
    assert vocabulary_digest(vocab) == hf["vocab_sha256"]  # HF's tokens with HF's ids
    entries = sorted(vocab.items(), key=lambda item: item[1])
    texts = [token.replace("\u2581", " ") for token, _ in entries]
    ours = gemma_tokenizer.backend.encode_batch(texts, add_special_tokens=False)
    other = hf["vocab_entries_not_their_own_id"]  # HF's ids where they are not the entry's own
    theirs = [other.get(str(i), [i]) for _, i in entries]
    mismatches = [t for t, a, b in zip(texts, ours, theirs, strict=True) if a.ids != b]
    assert mismatches == []


def test_long_document_matches_hf(gemma_tokenizer, hf):
    assert gemma_tokenizer.encode(long_document()) == hf["long_document_ids"]


def test_vocabulary_and_special_ids(gemma_tokenizer, hf):
    assert gemma_tokenizer.vocab_size == hf["len"] == 262144
    assert gemma_tokenizer.bos_token_id == hf["bos_token_id"] == 2
    assert gemma_tokenizer.eos_token_id == hf["eos_token_id"] == 1
    assert gemma_tokenizer.pad_token_id == hf["pad_token_id"] == 0
    assert gemma_tokenizer.token_to_id("<end_of_turn>") == 106
    assert gemma_tokenizer.eos_token_ids == (1, 106)
    assert gemma_tokenizer.special_tokens == {
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"
    }  # fmt: skip
    hf_special = set(hf["special_ids"])
    assert set(gemma_tokenizer.all_special_ids) == hf_special
    assert {0, 1, 2, 3, 4, 105, 106} <= hf_special


def test_chat_prompt_tokens(gemma_tokenizer):
    ids = gemma_tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [2, 105, gemma_tokenizer.token_to_id("user")]  # one BOS, not two
    assert ids[-3:] == [105, gemma_tokenizer.token_to_id("model"), 107]
