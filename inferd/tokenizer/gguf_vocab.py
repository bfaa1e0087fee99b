"""Rebuilding a `tokenizers.Tokenizer` from the vocabulary a GGUF file carries.

A GGUF has no tokenizer.json: it stores llama.cpp's view of the vocabulary (tokens, token types,
scores, sometimes merges). The reference for turning that back into a HF tokenizer is HF
transformers' GGUF conversion, and the engine must tokenize exactly as it does, so every choice
below mirrors it (including its quirks, which are marked). Three shapes:

- "llama" + gemma/gemma2/gemma3: SentencePiece BPE with byte fallback. The file has no merges, so
  they are recovered from the vocabulary: every way of cutting a token into two tokens is a merge,
  ranked by the position of the token in the file (Gemma's scores do not follow its merge order).
- "llama" otherwise: LlamaTokenizer's shape (Metaspace pre-tokenizer), merges from the file or
  recovered with the file's scores as ranks.
- "gpt2": byte-level BPE with the file's merges and a split regex chosen by `tokenizer.ggml.pre`.

Recovering Gemma's 515k merges costs about a second, and parsing them is most of the cost of
loading any tokenizer this size, so merges that can never fire are dropped (exactly: see
`prune_dead_merges`) and the result is cached, keyed by a vocabulary hash (gguf_backend.py:
as the compact tokenizer's tables for Gemma, as a tokenizer.json otherwise).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Regex, decoders, normalizers, pre_tokenizers
from tokenizers import models as tk_models

from inferd.errors import ModelLoadError
from inferd.loader.gguf_strings import StringArray, encode_strings
from inferd.tokenizer.bpe_merges import derive_merges, prune_dead_merges

# NOTE: part of the cache key; bump it whenever the JSON built here changes, so stale caches
# are ignored instead of silently tokenizing the old way.
BUILDER_VERSION = 1

CONTROL, USER_DEFINED = 3, 4
GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
SPIECE_SPACE = "\u2581"

# Pre-tokenizer split patterns by `tokenizer.ggml.pre`. These are the published pre-tokenization
# rules of each model family (data, not code): the merges were learned on text split this way.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_FAMILIES = {
    _LLAMA3_SPLIT: "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 "
    "jina-v5-nano dbrx smaug-bpe",
    _QWEN2_SPLIT: "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez",
    _QWEN35_SPLIT: "qwen35",
    _GPT4O_SPLIT: "gpt-4o llama4 kanana2 talkie minimax-m2",
    _TEKKEN_SPLIT: "tekken",
}
SPLIT_BY_PRE = {name: rx for rx, names in _SPLIT_FAMILIES.items() for name in names.split()}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes
    are moved to code points 256+ so that every byte has a visible, non-space character."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in mapping):
        mapping[b] = chr(256 + n)
    return mapping


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer-related metadata of a GGUF file, under plain names."""

    model: str
    pre: str
    architecture: str
    # NOTE: as the GGUF file gives them (StringArray: decoded when read), so that a warm start,
    # which only hashes them, keeps no Python string of them (load_gguf_backend)
    tokens: Sequence[str]
    token_types: np.ndarray | None
    scores: np.ndarray | None
    merges: Sequence[str] | None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], architecture: str) -> GGUFVocab:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError(
                "the GGUF file has no tokenizer.ggml.tokens: it carries no vocabulary"
            )

        def array(key: str) -> np.ndarray | None:
            value = metadata.get(key)
            return None if value is None else np.asarray(value)

        merges = metadata.get("tokenizer.ggml.merges")
        return cls(
            model=str(metadata.get("tokenizer.ggml.model", "")),
            pre=str(metadata.get("tokenizer.ggml.pre", "")),
            architecture=architecture,
            tokens=tokens,
            token_types=array("tokenizer.ggml.token_type"),
            scores=array("tokenizer.ggml.scores"),
            merges=merges,
        )

    def cache_key(self) -> str:
        """sha256 over everything the built tokenizer depends on."""
        digest = hashlib.sha256()
        header = [BUILDER_VERSION, self.model, self.pre, self.architecture]
        digest.update(json.dumps(header).encode())
        _hash_strings(digest, self.tokens)
        for array in (self.token_types, self.scores):
            digest.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
        if self.merges is not None:
            _hash_strings(digest, self.merges)
        return digest.hexdigest()


def _hash_strings(digest: Any, strings: Sequence[str]) -> None:
    # The GGUF encoding (each string's length, then its bytes): unambiguous, and for a file's
    # array its own bytes, hashed without decoding a string.
    if isinstance(strings, StringArray):
        digest.update(strings.encoded())
    else:
        digest.update(encode_strings(strings))


def _state(component: Any) -> Any:
    """The JSON form `tokenizers` gives a component (its pickle state is its serialisation)."""
    return None if component is None else json.loads(component.__getstate__())


@dataclass
class _Shape:
    vocab: dict[str, int]
    merges: list[tuple]
    model_options: dict[str, Any]
    normalizer: Any = None
    pre_tokenizer: Any = None
    decoder: Any = None


_SPM_DECODER = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]


_GEMMA_OPTIONS = {"unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True}
_GEMMA_NORMALIZER = functools.partial(normalizers.Replace, " ", SPIECE_SPACE)
_GEMMA_PRE_TOKENIZER = functools.partial(pre_tokenizers.Split, " ", "merged_with_previous")


def _gemma_shape(v: GGUFVocab) -> _Shape:
    if v.model == "gemma4":  # stored as the tokenizer spells it, and scores follow merge order
        tokens, ranks = v.tokens, v.scores
    else:
        # llama.cpp stores Gemma's whitespace-run tokens with real spaces; the tokenizer looks
        # them up as "▁▁...". NOTE: HF tests `not t.strip()`, so a token mixing spaces and
        # newlines would become all "▁" too; kept for parity (Gemma 3's file has none). Gemma's
        # scores do not follow its merge order; the token positions do (ranks=None).
        tokens = [SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in v.tokens]
        ranks = None
    return _Shape(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=_split_merges(v.merges) if v.merges else derive_merges(tokens, ranks),
        model_options=dict(_GEMMA_OPTIONS),
        normalizer=_GEMMA_NORMALIZER(),
        pre_tokenizer=_GEMMA_PRE_TOKENIZER(),
        decoder=decoders.Sequence(_SPM_DECODER),
    )


def _llama_shape(v: GGUFVocab, phi3: bool = False) -> _Shape:
    shape = _Shape(
        vocab={t: i for i, t in enumerate(v.tokens)},
        merges=_split_merges(v.merges) if v.merges else derive_merges(v.tokens, v.scores),
        model_options={"unk_token": None, "fuse_unk": True, "byte_fallback": True},
        # NOTE: HF ignores `add_space_prefix` here and always prepends "▁" to the first word.
        pre_tokenizer=pre_tokenizers.Metaspace(SPIECE_SPACE, prepend_scheme="first", split=False),
        decoder=decoders.Sequence([*_SPM_DECODER, decoders.Strip(" ", 1, 0)]),
    )
    if phi3:  # Phi-3 prepends the space in a normalizer, which differs on text starting with " "
        prepend = normalizers.Prepend(SPIECE_SPACE)
        shape.normalizer = normalizers.Sequence([prepend, normalizers.Replace(" ", SPIECE_SPACE)])
        shape.pre_tokenizer = None
    return shape


def _gpt2_shape(v: GGUFVocab) -> _Shape:
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(v.tokens)
    }
    merges = _split_merges(v.merges) if v.merges else derive_merges(v.tokens, v.scores)
    return _Shape(
        vocab=vocab,
        merges=merges,
        model_options={
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
        },
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False),
        decoder=decoders.ByteLevel(),
    )


def _split_merges(merges: Sequence[str]) -> list[tuple]:
    return [tuple(m.split(" ")) for m in merges]


def _shape_for(v: GGUFVocab) -> _Shape:
    if (v.model == "llama" and v.architecture in GEMMA_ARCHITECTURES) or v.model == "gemma4":
        return _gemma_shape(v)
    if v.model == "llama":
        return _llama_shape(v, phi3=v.architecture == "phi3")
    if v.model == "gpt2":
        return _gpt2_shape(v)
    raise ModelLoadError(
        f"cannot build a tokenizer for GGUF tokenizer.ggml.model={v.model!r} "
        f"(architecture {v.architecture!r}); supported: 'llama' (SentencePiece), 'gpt2', 'gemma4'"
    )


def _added_tokens(v: GGUFVocab, vocab: dict[str, int]) -> list[dict[str, Any]]:
    """Control tokens become special added tokens, user-defined ones plain added tokens, so the
    text is cut at them before BPE (llama.cpp matches both whole)."""
    if v.token_types is None:
        return []
    types = v.token_types.tolist()
    byte_level = v.model == "gpt2"
    alphabet = set(bytes_to_unicode().values()) if byte_level else None
    added: dict[str, dict[str, Any]] = {}
    for wanted, special in ((CONTROL, True), (USER_DEFINED, False)):
        for token, kind in zip(v.tokens, types, strict=False):
            if kind != wanted or token in added or token not in vocab:
                # NOTE: "not in vocab" drops user-defined tokens that were respelled (Gemma's
                # space runs stay ordinary BPE tokens, as in HF).
                continue
            if special and alphabet is not None and not set(token) <= alphabet:
                continue  # a byte-level "control" token outside the byte alphabet is mislabelled
            added[token] = {
                "id": vocab[token], "content": token, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": special,
            }  # fmt: skip
    return sorted(added.values(), key=lambda t: t["id"])


def build_pipeline(v: GGUFVocab) -> tuple[_Shape, list[tuple], list[dict[str, Any]]]:
    """The vocabulary's pipeline, its live merges in rank order, and its added tokens."""
    shape = _shape_for(v)
    split = SPLIT_BY_PRE.get(v.pre)
    if split is not None:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        isolated = pre_tokenizers.Split(Regex(split), behavior="isolated")
        shape.pre_tokenizer = pre_tokenizers.Sequence([isolated, byte_level])
    byte_fallback = shape.model_options["byte_fallback"]
    merges = prune_dead_merges(shape.merges, shape.vocab, byte_fallback)
    return shape, merges, _added_tokens(v, shape.vocab)


def build_tokenizer_json(v: GGUFVocab, built: tuple | None = None) -> str:
    """The tokenizer.json text for this vocabulary (no post-processor: BOS/EOS policy is the
    caller's, so one cached file serves files that differ only in those flags). `built`:
    `build_pipeline(v)`, when already at hand."""
    return _document(*(built or build_pipeline(v)))


def gemma_tokenizer_json(tokens: Sequence[str], merges: Sequence[tuple[str, str]],
                         added: list[dict[str, Any]]) -> str:  # fmt: skip
    """The tokenizer.json of Gemma's shape for a vocabulary already spelled as the tokenizer
    looks tokens up, its live merges in rank order and its added tokens: what
    `build_tokenizer_json` gives for the GGUF vocabulary they came from (the compact
    tokenizer's HF twin is built from its own tables this way)."""
    shape = _Shape({t: i for i, t in enumerate(tokens)}, [], dict(_GEMMA_OPTIONS),
                   _GEMMA_NORMALIZER(), _GEMMA_PRE_TOKENIZER(),
                   decoders.Sequence(_SPM_DECODER))  # fmt: skip
    return _document(shape, list(merges), added)


def _document(shape: _Shape, merges: list[tuple], added: list[dict[str, Any]]) -> str:
    options = shape.model_options
    model = _state(tk_models.BPE({}, [], **options))
    # NOTE: two measured load-time savings (about 30% of `Tokenizer.from_file`): a vocabulary
    # written in key order, and merges as "left right" strings (valid when no token has a space).
    model["vocab"] = dict(sorted(shape.vocab.items()))
    if any(" " in token for token in shape.vocab):
        model["merges"] = [list(pair) for pair in merges]
    else:
        model["merges"] = [f"{left} {right}" for left, right in merges]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": _state(shape.normalizer),
        "pre_tokenizer": _state(shape.pre_tokenizer),
        "post_processor": None,
        "decoder": _state(shape.decoder),
        "model": model,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))
