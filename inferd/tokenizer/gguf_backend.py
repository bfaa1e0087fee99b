"""Which tokenizer a GGUF vocabulary gets, and its cache: the compact tokenizer (compact_bpe.py)
where it computes what HF does (Gemma's SentencePiece vocabularies) and a C compiler is found,
from `<key>.bpe`; HF `tokenizers` otherwise, from `<key>.json` (gguf_vocab.py builds both
from the vocabulary). The key is a hash of the vocabulary (`GGUFVocab.cache_key`)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from inferd.errors import ModelLoadError
from inferd.tokenizer.gguf_vocab import (
    GEMMA_ARCHITECTURES,
    SPLIT_BY_PRE,
    GGUFVocab,
    build_pipeline,
    build_tokenizer_json,
)  # fmt: skip

if TYPE_CHECKING:
    from inferd.tokenizer.compact_bpe import CompactBPE

log = logging.getLogger(__name__)

TOKENIZER_ENV = "INFERD_TOKENIZER"
TOKENIZER_CHOICES = ("auto", "compact", "tokenizers")


def load_gguf_backend(v: GGUFVocab, cache_folder: Path | None) -> Tokenizer | CompactBPE:
    """The tokenizer for this vocabulary. A Gemma SentencePiece vocabulary gets the compact
    tokenizer (compact_bpe.py), from `cache_folder/<key>.bpe`; any other, or where no C
    compiler is found, HF `tokenizers` from `cache_folder/<key>.json`. `INFERD_TOKENIZER`
    chooses: "auto" (default), "compact" (an error where it does not apply), "tokenizers".
    Cached files are used only when intact (inferd/cache.py); a damaged one is logged,
    deleted and rebuilt."""
    choice = os.environ.get(TOKENIZER_ENV, "auto").strip().lower() or "auto"
    if choice not in TOKENIZER_CHOICES:
        raise ModelLoadError(f"{TOKENIZER_ENV}={choice!r}: expected one of "
                             f"{', '.join(TOKENIZER_CHOICES)}")  # fmt: skip
    key = v.cache_key()
    json_path = cache_folder / f"{key}.json" if cache_folder is not None else None
    if choice != "tokenizers" and compact_applies(v):
        from inferd.tokenizer.compact_bpe import CompactUnavailable

        bpe_path = cache_folder / f"{key}.bpe" if cache_folder is not None else None
        try:
            return _load_compact(v, bpe_path)
        except CompactUnavailable as e:
            if choice == "compact":
                raise ModelLoadError(f"{TOKENIZER_ENV}=compact: {e}") from e
            log.info("the compact tokenizer is unavailable (%s): using HF tokenizers", e)
    elif choice == "compact":
        raise ModelLoadError(
            f"{TOKENIZER_ENV}=compact: the compact tokenizer covers Gemma's SentencePiece "
            f"vocabularies only, not tokenizer.ggml.model={v.model!r} pre={v.pre!r} "
            f"(architecture {v.architecture!r})"
        )
    return _load_hf_backend(v, json_path)


def compact_applies(v: GGUFVocab) -> bool:
    """Whether the compact tokenizer computes what HF does for this vocabulary: Gemma's shape
    (spaces as U+2581, the whole text between added tokens one BPE word, byte fallback)."""
    gemma = (v.model == "llama" and v.architecture in GEMMA_ARCHITECTURES) or v.model == "gemma4"
    return gemma and SPLIT_BY_PRE.get(v.pre) is None


def _load_compact(v: GGUFVocab, path: Path | None) -> CompactBPE:
    from inferd.cache import discard, publish, verified
    from inferd.tokenizer.compact_bpe import CompactBPE, CompactUnavailable, library
    from inferd.tokenizer.compact_tables import build_tables, read_tables, write_tables

    library()  # CompactUnavailable before any work
    if path is not None and verified(path):
        try:
            return CompactBPE(*read_tables(path))
        except (ValueError, KeyError) as e:  # intact but of another layout
            discard(path, f"unreadable: {e}")
    from inferd.progress import status

    with status(f"building the tokenizer from the GGUF vocabulary ({len(v.tokens)} tokens)"):
        shape, live_merges, added = build_pipeline(_in_memory(v))
        by_id = sorted(shape.vocab, key=shape.vocab.__getitem__)
        if [shape.vocab[t] for t in by_id] != list(range(len(v.tokens))):
            # NOTE: respelled tokens that collide leave ids without a token; HF copes, the
            # tables do not (every id has one token): stay with HF.
            raise CompactUnavailable("the vocabulary's tokens are not one per id")
        try:
            arrays, meta = build_tables(by_id, live_merges, added, shape.model_options["unk_token"])
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    if path is None:
        return CompactBPE(arrays, meta)
    try:  # written beside a checksum, renamed into place: readers see all of it or none
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tables(tmp, arrays, meta)
        publish(tmp, path)
    except OSError as e:  # a read-only cache only costs speed
        log.warning("could not cache the tokenizer at %s: %s", path, e)
        tmp.unlink(missing_ok=True)
        return CompactBPE(arrays, meta)
    return CompactBPE(*read_tables(path))


def _load_hf_backend(v: GGUFVocab, path: Path | None) -> Tokenizer:
    """HF `tokenizers`' tokenizer for this vocabulary, from `path` when present and intact."""
    from inferd.cache import discard, verified

    if path is not None and verified(path):
        try:
            return Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - intact but foreign (another tokenizers version)
            discard(path, f"unreadable: {e}")
    from inferd.progress import status

    with status(f"building the tokenizer from the GGUF vocabulary ({len(v.tokens)} tokens)"):
        text = build_tokenizer_json(_in_memory(v))
        backend = Tokenizer.from_str(text)
    if path is not None:
        _write_atomically(path, text)
    return backend


def _in_memory(v: GGUFVocab) -> GGUFVocab:
    """`v` with its strings decoded into lists (the builders read each many times)."""
    merges = None if v.merges is None else list(v.merges)
    return replace(v, tokens=list(v.tokens), merges=merges)


def _write_atomically(path: Path, text: str) -> None:
    # Temp file, checksum, rename (inferd/cache.py `publish_text`): a reader sees the old file
    # or the whole new one, even with two processes building at once.
    from inferd.cache import publish_text

    try:
        publish_text(path, text)
    except OSError as e:  # a read-only cache only costs speed
        log.warning("could not cache the tokenizer at %s: %s", path, e)
