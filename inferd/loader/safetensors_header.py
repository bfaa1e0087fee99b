"""Reading and checking a safetensors file's header before the `safetensors` library maps it.

The format: an 8-byte little-endian header length, a JSON object `name → {dtype, shape,
data_offsets: [begin, end]}` (plus an optional `__metadata__` of strings), then the tensor
bytes. A checkpoint is untrusted input, so every field is checked against the format's rules
and the file's length: each failure is one `ModelLoadError` naming the file, the tensor and
the problem, instead of the library's terse error codes (or, where the library is lenient, a
wrong tensor later).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from inferd.errors import ModelLoadError

# The safetensors library refuses larger headers too; it bounds what a lying length can cost.
MAX_HEADER_BYTES = 100_000_000
# Bytes per element of each dtype the format names (sub-byte float types are not supported).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header object and the size of the data section that follows it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{path}: not a safetensors file ({size} bytes, too short)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise ModelLoadError(
                    f"{path}: safetensors header length {length} exceeds the file "
                    f"({size} bytes) or the {MAX_HEADER_BYTES}-byte limit"
                )
            raw = f.read(length)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read the file ({e.strerror or e})") from e
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except ValueError as e:  # also UnicodeDecodeError and our duplicate-key error
        raise ModelLoadError(f"{path}: safetensors header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: safetensors header is not a JSON object")
    return header, size - 8 - length


def _tensor_entry(path: Path, name: str, entry: Any) -> tuple[tuple[int, ...], str, int, int]:
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{path}: tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise ModelLoadError(
            f"{path}: tensor {name!r}: unsupported dtype {dtype!r} "
            f"(known: {', '.join(DTYPE_BYTES)})"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ModelLoadError(
            f"{path}: tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise ModelLoadError(
            f"{path}: tensor {name!r}: data_offsets must be [begin, end] with "
            f"0 <= begin <= end, got {offsets!r}"
        )
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != expected:
        raise ModelLoadError(
            f"{path}: tensor {name!r}: {dtype} {shape} needs {expected} bytes but its "
            f"data_offsets span {end - begin} (dtype or shape does not match the data)"
        )
    return tuple(shape), dtype, begin, end


def read_safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (shape, dtype) of every tensor, after checking the whole header: known dtypes,
    sizes that match dtype × shape, and tensors that tile the data section exactly (no
    overlap, no gap, nothing past the end), as the format requires."""
    header, data_bytes = _read_header(path)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise ModelLoadError(f"{path}: safetensors __metadata__ must map strings to strings")
    entries = {name: _tensor_entry(path, name, entry) for name, entry in header.items()}
    position, previous = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            problem = "overlaps" if begin < position else "leaves a gap after"
            what = f"tensor {previous!r}" if previous else "the start of the data"
            raise ModelLoadError(f"{path}: tensor {name!r} {problem} {what} (bad data_offsets)")
        position, previous = end, name
    if position != data_bytes:
        raise ModelLoadError(
            f"{path}: the tensors' data ends at byte {position} of a {data_bytes}-byte data "
            "section (truncated file or bad data_offsets)"
        )
    return {name: (shape, dtype) for name, (shape, dtype, _, _) in entries.items()}
