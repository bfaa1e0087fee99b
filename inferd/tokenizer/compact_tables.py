"""The tables of the compact BPE tokenizer (compact_bpe.c), built from a vocabulary and its
merges, and kept in the cache as one file that later starts map read-only.

HF `tokenizers` keeps a 262k-token vocabulary as hash maps of separately allocated strings,
both ways, plus a hash map of merges: about 80 MiB resident for Gemma's, and a third of a
second to parse its tokenizer.json. These tables hold the same facts in ~8 MiB of flat arrays:

- `blob` / `offsets`: token i's UTF-8 bytes are blob[offsets[i]:offsets[i + 1]];
- `sorted`: every id, ordered by its bytes (string -> id by binary search);
- `merge_keys` / `merge_ranks` / `merge_ids`: each merge (left << 32 | right), ascending, with
  its rank and the id it makes;
- `special` (one byte per id) and `added` (the ids cut out of text before BPE).

File layout: 8 bytes of magic, a little-endian u64 header length, a JSON header (each array's
dtype, length and offset; `meta`), then the arrays, each 64-byte aligned.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"INFDBPE1"
_ALIGN = 64


def build_tables(
    tokens: Sequence[str], merges: Sequence[tuple[str, str]], added: Sequence[dict[str, Any]],
    unk_token: str | None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    """Arrays and metadata for a vocabulary whose token i is `tokens[i]` (all distinct),
    merges in rank order (a later duplicate overrides, as a dict does in HF), and added tokens
    as tokenizer.json lists them. ValueError when a merge names a token the vocabulary lacks
    (HF refuses such a file too)."""
    encoded = [t.encode("utf-8") for t in tokens]
    n = len(encoded)
    ids = {t: i for i, t in enumerate(tokens)}
    if len(ids) != n:
        raise ValueError("the vocabulary has duplicate tokens")
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.uint32, count=n)
    offsets = np.zeros(n + 1, dtype=np.uint32)
    np.cumsum(lengths, out=offsets[1:])
    table: dict[int, tuple[int, int]] = {}
    for rank, (left, right) in enumerate(merges):
        try:
            key = ids[left] << 32 | ids[right]
            table[key] = (rank, ids[left + right])
        except KeyError as e:
            raise ValueError(f"merge {left!r} {right!r} names a token not in the vocabulary: "
                             f"{e.args[0]!r}") from None  # fmt: skip
    keys = np.array(sorted(table), dtype=np.uint64)
    values = np.array([table[k] for k in keys.tolist()], dtype=np.uint32).reshape(-1, 2)
    special = np.zeros(n, dtype=np.uint8)
    for token in added:
        if token["special"]:
            special[token["id"]] = 1
    arrays = {
        "blob": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "offsets": offsets,
        "sorted": np.array(sorted(range(n), key=encoded.__getitem__), dtype=np.uint32),
        "merge_keys": keys,
        "merge_ranks": np.ascontiguousarray(values[:, 0]),
        "merge_ids": np.ascontiguousarray(values[:, 1]),
        "special": special,
        "added": np.array([t["id"] for t in added], dtype=np.int32),
    }
    meta = {"unk_id": ids.get(unk_token, -1) if unk_token is not None else -1}
    return arrays, meta


def write_tables(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    layout, offset = {}, 0
    for name, array in arrays.items():
        layout[name] = [array.dtype.str, int(array.size), offset]
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"meta": meta, "arrays": layout}).encode()
    start = -(-(16 + len(header)) // _ALIGN) * _ALIGN
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for name, array in arrays.items():
            f.seek(start + layout[name][2])
            f.write(np.ascontiguousarray(array).tobytes())
        f.truncate(start + offset)


def read_tables(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays as read-only views of the mapped file (pages shared by every process that
    maps it, read from the page cache as used). ValueError for a file of another layout."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if len(data) < 16 or bytes(data[:8]) != MAGIC:
        raise ValueError(f"{path}: not a compact tokenizer file")
    (size,) = struct.unpack("<Q", bytes(data[8:16]))
    header = json.loads(bytes(data[16 : 16 + size]))
    start = -(-(16 + size) // _ALIGN) * _ALIGN
    arrays = {}
    for name, (dtype, count, offset) in header["arrays"].items():
        arrays[name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count,
                                     offset=start + offset)  # fmt: skip
    check_tables(arrays)
    return arrays, header["meta"]


def check_tables(arrays: dict[str, np.ndarray]) -> None:
    """ValueError unless every index the C code follows stays inside its array (a file of
    another layout must not make it read out of bounds)."""
    expected = {"blob": "u1", "offsets": "u4", "sorted": "u4", "merge_keys": "u8",
                "merge_ranks": "u4", "merge_ids": "u4", "special": "u1", "added": "i4"}  # fmt: skip
    for name, code in expected.items():
        if name not in arrays or arrays[name].dtype != np.dtype(code).newbyteorder("="):
            raise ValueError(f"compact tokenizer tables: {name!r} missing or not {code}")
    n = len(arrays["sorted"])
    offsets, keys, added = arrays["offsets"], arrays["merge_keys"], arrays["added"]

    def below_n(values: np.ndarray) -> bool:
        return len(values) == 0 or (int(values.min()) >= 0 and int(values.max()) < n)

    ok = (
        len(offsets) == n + 1
        and len(arrays["special"]) == n
        and int(offsets[-1]) <= len(arrays["blob"])
        and bool(np.all(offsets[1:] >= offsets[:-1]))
        and below_n(arrays["sorted"])
        and len(arrays["merge_ranks"]) == len(keys) == len(arrays["merge_ids"])
        and below_n(arrays["merge_ids"])
        and below_n(keys >> np.uint64(32))
        and below_n(keys & np.uint64(0xFFFFFFFF))
        and below_n(added)
    )
    if not ok:
        raise ValueError("compact tokenizer tables: an index points outside its array")
