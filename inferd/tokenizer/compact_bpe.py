"""The compact BPE tokenizer: what HF `tokenizers` computes for a SentencePiece BPE vocabulary
built from a Gemma GGUF, from flat tables (compact_tables.py) and a small C file
(compact_bpe.c), at a tenth of the memory and with no parse at start-up.

`CompactBPE` answers the part of the `tokenizers.Tokenizer` interface inferd uses: `encode`
(ids and character offsets), `decode`, `id_to_token`, `token_to_id`, the vocabulary's size and
added tokens. What it does not do itself, serialising to tokenizer.json (`to_str`, `save`:
structured outputs, `inferd export-tokenizer`), goes to the equivalent HF tokenizer, built
from the same tables on first use. Its encodings are checked against HF's on the same vocabulary
(tests/unit/test_compact_bpe.py, tests/parity/test_tokenizer_parity.py).

The C library is compiled once per compiler into the cache, like the CPU kernels, with plain
flags (no ISA variant: a tokenizer is not where the time goes). Without a C compiler the
engine keeps HF `tokenizers` (`INFERD_TOKENIZER`, gguf_vocab.py).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

import inferd.c_compiler as c_compiler

SOURCE = Path(__file__).with_name("compact_bpe.c")
FLAGS = ("-O2", "-fPIC", "-std=c11", "-shared")
SPIECE_SPACE = "\u2581"

# Which added tokens are cut out of the text (compact_bpe.c's MATCH_* modes).
MATCH_ALL, MATCH_KEEP_SPECIAL_TEXT, MATCH_SPECIAL_ONLY = 0, 1, 2

FEW_IDS = 64  # ids `decode` passes without numpy (a streaming window is a handful)


class CompactUnavailable(RuntimeError):
    """The compact tokenizer cannot be built here (no compiler, a failed build); says why."""


@functools.cache
def _library() -> ctypes.CDLL | CompactUnavailable:
    from inferd.cache import cache_dir, publish, verified

    try:
        cc = c_compiler.find_compiler()
        key = c_compiler.source_key([SOURCE], c_compiler.compiler_version(cc), " ".join(FLAGS))
        path = cache_dir() / "kernels" / f"inferd_bpe-{key}.so"
        if not verified(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                out = Path(tmp) / path.name
                c_compiler.run_compiler(
                    [cc, *FLAGS, str(SOURCE), "-o", str(out)], "the compact tokenizer"
                )
                publish(out, path)
        lib = ctypes.CDLL(str(path))
    except (c_compiler.NoCompiler, OSError) as e:
        return CompactUnavailable(str(e))
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    lib.inferd_bpe_new.argtypes = [ptr] * 3 + [i64] + [ptr] * 3 + [i64, ptr, ptr, i64, i32]
    lib.inferd_bpe_new.restype = ptr
    lib.inferd_bpe_free.argtypes = [ptr]
    lib.inferd_bpe_free.restype = None
    lib.inferd_bpe_lookup.argtypes = [ptr, ctypes.c_char_p, i64]
    lib.inferd_bpe_lookup.restype = i64
    lib.inferd_bpe_encode.argtypes = [ptr, ctypes.c_char_p, i64, i32, ptr, ptr, ptr]
    lib.inferd_bpe_encode.restype = i64
    lib.inferd_bpe_decode.argtypes = [ptr, ptr, i64, i32, ptr, i64]
    lib.inferd_bpe_decode.restype = i64
    return lib


def library() -> ctypes.CDLL:
    """The compiled C part (built on first use); CompactUnavailable says why not."""
    lib = _library()
    if isinstance(lib, CompactUnavailable):
        raise lib
    return lib


class _Handle:
    """The C tables' handle, freed with the last backend (or view) holding it."""

    def __init__(self, lib: ctypes.CDLL, arrays: dict[str, np.ndarray], unk_id: int):
        self.lib, self.arrays = lib, arrays  # the C side points into the arrays: keep them
        a = arrays
        self.ptr = lib.inferd_bpe_new(
            a["blob"].ctypes.data, a["offsets"].ctypes.data, a["sorted"].ctypes.data,
            len(a["sorted"]), a["merge_keys"].ctypes.data, a["merge_ranks"].ctypes.data,
            a["merge_ids"].ctypes.data, len(a["merge_keys"]), a["special"].ctypes.data,
            a["added"].ctypes.data, len(a["added"]), unk_id,
        )  # fmt: skip
        if not self.ptr:
            raise MemoryError("cannot allocate the compact tokenizer's added-token trie")

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.inferd_bpe_free(self.ptr)


class CompactEncoding:
    """An encode's result: `ids`, and `offsets` as (start, end) character positions in the
    text (computed on first use; added BOS/EOS have (0, 0))."""

    def __init__(self, ids: list[int], data: bytes, starts: np.ndarray, ends: np.ndarray,
                 prefix: int, suffix: int):  # fmt: skip
        self.ids = ids
        self._data, self._spans, self._around = data, (starts, ends), (prefix, suffix)

    @functools.cached_property
    def offsets(self) -> list[tuple[int, int]]:
        starts, ends = self._spans
        if not self._data.isascii():  # byte offsets to character offsets
            raw = np.frombuffer(self._data, dtype=np.uint8)
            chars_before = np.zeros(len(raw) + 1, dtype=np.int64)
            np.cumsum((raw & 0xC0) != 0x80, out=chars_before[1:])
            starts, ends = chars_before[starts], chars_before[ends]
        prefix, suffix = self._around
        spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
        return [(0, 0)] * prefix + spans + [(0, 0)] * suffix


class CompactBPE:
    """A SentencePiece BPE tokenizer over compact tables (see the module's docstring)."""

    def __init__(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]):
        self._handle = _Handle(library(), arrays, int(meta["unk_id"]))
        self._lib, self._ptr = self._handle.lib, self._handle.ptr
        self._blob, self._offsets = arrays["blob"], arrays["offsets"]
        self._special, self._added = arrays["special"], arrays["added"]
        self._mode = MATCH_ALL
        # [ids before, ids after] every sequence when add_special_tokens (the post-processor),
        # shared with the views, so setting it once sets it for all
        self._around: list[list[int]] = [[], []]
        self._arrays, self._meta = arrays, meta
        self._hf: list[Backend] = []  # shared with the views too
        self.post_processor: Any = None
        self.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        self.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        self.decoder = decoders.Sequence([decoders.Replace(SPIECE_SPACE, " "),
                                          decoders.ByteFallback(), decoders.Fuse()])  # fmt: skip

    # --- what the engine calls ---------------------------------------------------------------

    def set_template(self, before: Sequence[int], after: Sequence[int], processor: Any) -> None:
        """Ids added around every sequence encoded with `add_special_tokens`, and the same
        rule as a `tokenizers` post-processor (for the HF tokenizer this one stands for)."""
        self._around[:] = [list(before), list(after)]
        self.post_processor = processor
        if self._hf:
            self._hf[0].post_processor = processor

    def matching(self, mode: str) -> CompactBPE:
        """A view over the same tables that cuts out other added tokens: "special" only the
        special ones (the text between is one token of id -1), "plain" none of the special
        ones, which stay text (HF's `encode_special_tokens`)."""
        view = copy.copy(self)
        view._mode = {"all": MATCH_ALL, "plain": MATCH_KEEP_SPECIAL_TEXT,
                      "special": MATCH_SPECIAL_ONLY}[mode]  # fmt: skip
        return view

    def encode(self, text: str, add_special_tokens: bool = True) -> CompactEncoding:
        """The tokens of `text`. Holds no Python lock while the C code runs (ctypes releases
        it), so a long text does not stall other threads."""
        data = text.encode("utf-8")
        capacity = len(data) + 2 * data.count(b" ")
        ids = np.empty(capacity, dtype=np.int32)
        starts, ends = np.empty(capacity, dtype=np.int64), np.empty(capacity, dtype=np.int64)
        count = self._lib.inferd_bpe_encode(self._ptr, data, len(data), self._mode,
                                            ids.ctypes.data, starts.ctypes.data,
                                            ends.ctypes.data)  # fmt: skip
        if count < 0:
            raise MemoryError(f"no memory to tokenize a text of {len(data)} bytes")
        before, after = self._around if add_special_tokens else ([], [])
        token_ids = [*before, *ids[:count].tolist(), *after]
        return CompactEncoding(token_ids, data, starts[:count], ends[:count], len(before),
                               len(after))  # fmt: skip

    def encode_batch(self, texts: Iterable[str], add_special_tokens: bool = True
                     ) -> list[CompactEncoding]:  # fmt: skip
        return [self.encode(text, add_special_tokens) for text in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; ids outside the vocabulary are skipped (as HF does), negative
        ones refused (OverflowError, as HF)."""
        if isinstance(ids, list) and 0 < len(ids) <= FEW_IDS:  # a detokenizer's window
            values = [int(i) for i in ids]  # plain Python: numpy costs more for a few ids
            if min(values) < 0 or max(values) >= 1 << 32:
                raise OverflowError("token ids must be non-negative 32-bit integers")
            array = (ctypes.c_int64 * len(values))(*values)
            count, address = len(values), ctypes.addressof(array)
        else:
            array = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
            if array.size and (array.min() < 0 or array.max() >= 1 << 32):
                raise OverflowError("token ids must be non-negative 32-bit integers")
            count, address = len(array), array.ctypes.data
        capacity = 8 * count + 64
        for _ in range(2):
            out = ctypes.create_string_buffer(capacity)
            size = self._lib.inferd_bpe_decode(
                self._ptr, address, count, bool(skip_special_tokens), out, capacity
            )
            if size < 0:
                raise MemoryError("no memory to decode")
            if size <= capacity:
                return out.raw[:size].decode("utf-8")
            capacity = size
        raise RuntimeError("decode did not fit the room it asked for")  # pragma: no cover

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < len(self._offsets) - 1:
            return None
        start, end = self._offsets[token_id], self._offsets[token_id + 1]
        return self._blob[start:end].tobytes().decode("utf-8")

    def token_to_id(self, token: str) -> int | None:
        data = token.encode("utf-8")
        found = self._lib.inferd_bpe_lookup(self._ptr, data, len(data))
        return None if found < 0 else int(found)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return len(self._offsets) - 1  # every added token is in the vocabulary too

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return {self.id_to_token(i): i for i in range(self.get_vocab_size())}

    def get_added_tokens_decoder(self) -> dict[int, AddedToken]:
        """Built on each call (6k objects for Gemma; the engine needs only `special_ids`)."""
        return {
            i: AddedToken(self.id_to_token(i), single_word=False, lstrip=False, rstrip=False,
                          normalized=False, special=bool(self._special[i]))
            for i in self._added.tolist()
        }  # fmt: skip

    def special_ids(self) -> tuple[int, ...]:
        """The ids of the special added tokens, ascending."""
        return tuple(np.flatnonzero(self._special).tolist())

    def max_token_bytes(self) -> int:
        """The longest token's UTF-8 length."""
        return int(np.diff(self._offsets).max(initial=0))

    # --- what goes to the HF tokenizer -------------------------------------------------------

    def hf(self) -> Backend:
        """The HF tokenizer with the same vocabulary and rules, built from these tables on
        first use (~1 s and ~80 MiB for Gemma's: only structured outputs and exports ask)."""
        if not self._hf:
            from inferd.tokenizer.gguf_vocab import gemma_tokenizer_json

            tokens = [self.id_to_token(i) for i in range(self.get_vocab_size())]
            keys = self._arrays["merge_keys"]
            order = np.argsort(self._arrays["merge_ranks"], kind="stable")
            merges = [(tokens[int(k) >> 32], tokens[int(k) & 0xFFFFFFFF])
                      for k in keys[order].tolist()]  # fmt: skip
            added = [{"id": i, "content": t.content, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": t.special}
                     for i, t in sorted(self.get_added_tokens_decoder().items())]  # fmt: skip
            backend = Backend.from_str(gemma_tokenizer_json(tokens, merges, added))
            if self.post_processor is not None:
                backend.post_processor = self.post_processor
            self._hf.append(backend)
        return self._hf[0]

    def __reduce__(self) -> tuple:
        """Pickled with its tables (a few MiB), as a process on another machine needs them
        (Ray Serve hands the tokenizer from the engine's replica to the ingress)."""
        arrays = {name: np.array(a) for name, a in self._arrays.items()}
        return _restore, (arrays, self._meta, self._mode, self._around, self.post_processor)

    def to_str(self, pretty: bool = False) -> str:
        return self.hf().to_str(pretty)

    def save(self, path: str, pretty: bool = True) -> None:
        self.hf().save(path, pretty)


def _restore(arrays: dict[str, np.ndarray], meta: dict[str, Any], mode: int,
             around: list[list[int]], processor: Any) -> CompactBPE:  # fmt: skip
    backend = CompactBPE(arrays, meta)
    backend._mode, backend._around[:] = mode, around
    backend.post_processor = processor
    return backend
