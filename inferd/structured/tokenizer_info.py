"""The model's vocabulary as llguidance sees it: the bytes of every token id, which ids are special,
which end a reply. Built once per model and shared by every grammar compiled for it.

llguidance can read a HF `tokenizer.json` itself, but that costs seconds for Gemma 3's 262,144
tokens (it derives each token's bytes through the tokenizer's decoder). The token bytes it derives
are cached on disk (`cache_dir()/structured/`, keyed by the tokenizer's serialized form and the
llguidance version), and every build, cold or warm, constructs the llguidance tokenizer from those
bytes, which is several times faster, so both paths give the same tokenizer.

The bitmask width follows the MODEL's vocabulary (its logits width), which may exceed the
tokenizer's (Gemma 3 pads to 262,144): ids without a token are never allowed.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import llguidance
import numpy as np

if TYPE_CHECKING:
    from inferd.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_FORMAT = "1"  # bump when the cache file's layout changes


@dataclass(frozen=True)
class TokenizerInfo:
    ll_tokenizer: llguidance.LLTokenizer
    vocab_size: int  # the model's: the width of its logits rows
    eos_token_ids: tuple[int, ...]  # each ends a constrained reply once the grammar allows it

    @property
    def bitmask_words(self) -> int:
        """int32 words per bitmask row: bit t % 32 of word t // 32 allows token t."""
        return (self.ll_tokenizer.vocab_size + 31) // 32


class _TokenSource:
    """What llguidance's TokenizerWrapper reads: token bytes, special ids and an encoder (used
    by llguidance to tokenize text it inserts, never for masks)."""

    def __init__(
        self,
        tokens: Sequence[bytes],
        special_token_ids: Sequence[int],
        eos_token_id: int,
        bos_token_id: int | None,
        encode: Callable[[str], list[int]],
    ):
        self.tokens = tokens
        self.special_token_ids = list(special_token_ids)
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes whether bytes are accepted
            raise TypeError("text expected")
        return self._encode(text)


def tokenizer_info_from_tokens(
    tokens: Sequence[bytes],
    *,
    eos_token_ids: Sequence[int],
    vocab_size: int | None = None,
    special_token_ids: Sequence[int] = (),
    bos_token_id: int | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> TokenizerInfo:
    """A TokenizerInfo from each id's bytes (tests build small vocabularies this way).
    `encode` defaults to greedy longest-match over `tokens`."""
    if not eos_token_ids:
        raise ValueError("a constrained reply needs at least one EOS token id to end it")
    n_vocab = max(vocab_size or 0, len(tokens))
    source = _TokenSource(
        tokens,
        special_token_ids,
        int(eos_token_ids[0]),
        bos_token_id,
        encode or (lambda text: []),
    )
    wrapper = llguidance.TokenizerWrapper(source)
    ll = llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=[int(i) for i in eos_token_ids])
    if encode is None:
        source._encode = lambda text: ll.greedy_tokenize(text)
    return TokenizerInfo(ll, vocab_size or n_vocab, tuple(int(i) for i in eos_token_ids))


def build_tokenizer_info(
    tokenizer: Tokenizer, vocab_size: int, *, cache: bool = True
) -> TokenizerInfo:
    """The TokenizerInfo of an inferd Tokenizer for a model whose logits have `vocab_size`
    columns. Costs ~1 s warm (llguidance builds its token trie); the first build for a tokenizer
    also derives and caches the token bytes (seconds)."""
    serialized = tokenizer.backend.to_str()
    digest = hashlib.sha256(
        f"{_FORMAT}|{llguidance.__version__}|".encode() + serialized.encode()
    ).hexdigest()[:32]
    path = _cache_path(digest) if cache else None
    loaded = _load(path) if path is not None else None
    if loaded is None:
        loaded = _derive(serialized, tokenizer.vocab_size)
        if path is not None:
            _save(path, *loaded)
    tokens, special = loaded
    return tokenizer_info_from_tokens(
        tokens,
        eos_token_ids=tokenizer.eos_token_ids,
        vocab_size=vocab_size,
        special_token_ids=special,
        bos_token_id=tokenizer.bos_token_id,
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
    )


def _derive(serialized: str, n_tokens: int) -> tuple[list[bytes], list[int]]:
    """Token bytes and special ids as llguidance derives them from tokenizer.json."""
    try:
        ll = llguidance.LLTokenizer(serialized, n_vocab=n_tokens)
    except Exception as e:  # noqa: BLE001 - llguidance reports unsupported tokenizers this way
        raise ValueError(f"structured outputs cannot use this model's tokenizer: {e}") from e
    tokens = [ll.decode_bytes([i]) for i in range(n_tokens)]
    special = [i for i in range(n_tokens) if ll.is_special_token(i)]
    return tokens, special


def _cache_path(digest: str) -> Path:
    from inferd.cache import cache_dir  # local: keeps the import light

    return cache_dir() / "structured" / f"tokens-{digest}.npz"


def _load(path: Path) -> tuple[list[bytes], list[int]] | None:
    from inferd.cache import discard, verified  # local: keeps the import light

    if not verified(path):  # missing, or damaged (then logged and deleted): rebuild
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            offsets, data, special = f["offsets"], f["data"].tobytes(), f["special"]
    except Exception as e:  # noqa: BLE001 - zipfile, numpy: intact but unreadable here
        discard(path, f"unreadable: {e}")
        return None
    tokens = [data[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return tokens, special.tolist()


def _save(path: Path, tokens: list[bytes], special: list[int]) -> None:
    from inferd.cache import publish

    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in tokens], out=offsets[1:])
    data = np.frombuffer(b"".join(tokens), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: written under a unique name, then its checksum, then renamed (inferd/cache.py), so
    # a concurrent reader never sees half a file (two processes building write the same bytes).
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, offsets=offsets, data=data, special=np.asarray(special, dtype=np.int32))
        publish(tmp, path)
    except OSError as e:  # a read-only cache only costs time
        log.warning("could not cache the token bytes at %s: %s", path, e)
        tmp.unlink(missing_ok=True)
