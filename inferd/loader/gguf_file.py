"""Reading the GGUF container: header, metadata and tensor directory, over one memory map.

The format (little-endian): magic "GGUF", version, tensor count, metadata count, then
`key → typed value` pairs, then one record per tensor (name, dims, ggml type, offset), then the
aligned tensor data. Vocabularies are 100k+ string arrays, so an array of strings is only located
in the map (gguf_strings.py decodes a string when it is read): the whole header of the embedded
model parses in a fraction of a second, and its vocabulary costs no Python strings.

A model file is untrusted input. Every count, length, nesting level, alignment, tensor shape,
type and offset is checked against the format's rules and the file's length before it is used,
so a damaged or crafted file fails with one `ModelLoadError` naming the file and the problem,
never with a huge allocation, a recursion error or a division by zero.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferd.errors import ModelLoadError
from inferd.loader.gguf_metadata import check_metadata
from inferd.loader.gguf_strings import StringArray

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Alignment must be a power of two (ggml's rule) no larger than this.
MAX_ALIGNMENT = 1 << 24
# Arrays of arrays: the format allows them, llama.cpp reads none; a few levels are plenty, and
# the bound keeps a crafted file from recursing (or looping) without end.
MAX_ARRAY_DEPTH = 4
MAX_TENSOR_DIMS = 4  # ggml's GGML_MAX_DIMS

# Metadata value types.
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12

_SCALAR_FORMATS = {
    _UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i",
    _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d",
}  # fmt: skip
_NUMPY_DTYPES = {
    _UINT8: np.uint8, _INT8: np.int8, _UINT16: np.uint16, _INT16: np.int16, _UINT32: np.uint32,
    _INT32: np.int32, _FLOAT32: np.float32, _BOOL: np.bool_, _UINT64: np.uint64,
    _INT64: np.int64, _FLOAT64: np.float64,
}  # fmt: skip


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (outermost first): the reverse of GGUF's ne[]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    n_bytes: int


class _Cursor:
    """Sequential little-endian reads over a buffer, with bounds checks that name the problem."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise ModelLoadError(
                f"{self.path}: GGUF header is truncated (needs byte {self.pos + n}, "
                f"file has {len(self.buf)})"
            )

    def check_count(self, count: int, min_item_bytes: int, what: str) -> None:
        """A count read from the file must fit in the bytes left: a lying count fails here,
        before anything is allocated or looped over for it."""
        left = len(self.buf) - self.pos
        if count * min_item_bytes > left:
            raise ModelLoadError(
                f"{self.path}: GGUF header claims {count} {what}, more than the "
                f"{left} bytes left in the file can hold (damaged or truncated file)"
            )

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FORMATS[vtype]
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return self.scalar(_UINT32)

    def u64(self) -> int:
        return self.scalar(_UINT64)

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, key: str) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(key, 1)
        if vtype not in _SCALAR_FORMATS:
            raise ModelLoadError(f"{self.path}: GGUF metadata {key!r}: unknown value type {vtype}")
        return self.scalar(vtype)

    def array(self, key: str, depth: int) -> Any:
        if depth > MAX_ARRAY_DEPTH:
            raise ModelLoadError(
                f"{self.path}: GGUF metadata {key!r}: arrays nested more than "
                f"{MAX_ARRAY_DEPTH} deep"
            )
        item_type, count = self.u32(), self.u64()
        if item_type == _STRING:
            self.check_count(count, 8, f"strings in {key!r}")
            return self._string_array(count)
        if item_type == _ARRAY:
            self.check_count(count, 12, f"arrays in {key!r}")
            return [self.array(key, depth + 1) for _ in range(count)]
        if item_type not in _NUMPY_DTYPES:
            raise ModelLoadError(
                f"{self.path}: GGUF metadata {key!r}: unknown array item type {item_type}"
            )
        dtype = np.dtype(_NUMPY_DTYPES[item_type])
        self.check_count(count, dtype.itemsize, f"values in {key!r}")
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * dtype.itemsize
        return arr

    def _string_array(self, count: int) -> StringArray:
        # NOTE: hot loop for vocabularies (262k entries for Gemma, ~1/25 of a warm start): it
        # only finds where each string lies (gguf_strings.py decodes them when read). No
        # bounds test per string: a length running past the file makes the next read fail,
        # and the last string's end is checked once.
        buf, pos = self.buf, self.pos
        unpack = struct.Struct("<Q").unpack_from
        starts = [0] * count
        try:
            for i in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                starts[i] = pos
                pos += n
        except (struct.error, OverflowError):  # OverflowError: a length past 2^63
            self.pos = min(pos, len(buf))
            self.need(8)  # raises: the length of the next string is past the end
        if pos > len(buf):
            self.pos = starts[-1]
            self.need(pos - starts[-1])  # raises: the last string runs past the end
        first, self.pos = self.pos, pos
        return StringArray(buf, np.array(starts, dtype=np.int64), pos, slice(first, pos))


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (name → info) and zero-copy tensor bytes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # mmap of an empty file
            raise ModelLoadError(f"{self.path}: empty file, not a GGUF model") from e
        except OSError as e:  # unreadable, a folder, a special file
            raise ModelLoadError(f"{self.path}: cannot read the file ({e.strerror or e})") from e
        buf = memoryview(self._mmap)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
        cur = _Cursor(buf, self.path)
        cur.pos = 4
        self.version = cur.u32()
        if self.version not in (2, 3):
            raise ModelLoadError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = cur.u64(), cur.u64()
        # Smallest possible entries: an empty key, a type and a one-byte value; an empty name,
        # one dimension, a type and an offset.
        cur.check_count(n_kv, 8 + 4 + 1, "metadata entries")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in self.metadata:
                raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} appears twice")
            self.metadata[key] = cur.value(cur.u32(), key)
        check_metadata(self.metadata, self.path)
        cur.check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensors")
        records = [self._tensor_record(cur) for _ in range(n_tensors)]
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if align & (align - 1) or align > MAX_ALIGNMENT:
            raise ModelLoadError(
                f"{self.path}: GGUF general.alignment {align} is not a power of two "
                f"from 1 to {MAX_ALIGNMENT}"
            )
        self.alignment = align
        data_start = (cur.pos + align - 1) // align * align
        self.tensors = self._place_tensors(records, data_start, len(buf))
        self._buf = buf

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident memory once what needed them is
        loaded: the header's vocabulary (parsed, and the tokenizer built) and the tensors read
        from the file (the dense ones, or all of them on a first load), about 45 MiB for the
        embedded model in a process whose blocks come from the weight cache. The mapping is
        read-only, so a later read faults its pages back from the page cache, unchanged."""
        dontneed = getattr(mmap, "MADV_DONTNEED", None)  # Linux and most Unixes
        if dontneed is not None:
            self._mmap.madvise(dontneed)

    def release_tensor(self, name: str) -> None:
        """Drop the whole pages of one tensor from this process's resident memory once it has
        been read: a first load then holds no more than the tensor being converted of the file,
        not the whole file beside what it was converted to."""
        dontneed = getattr(mmap, "MADV_DONTNEED", None)
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page
        stop = (info.offset + info.n_bytes) // page * page
        if dontneed is not None and stop > start:
            self._mmap.madvise(dontneed, start, stop - start)

    def _tensor_record(self, cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
        name = cur.string()
        n_dims = cur.u32()
        if not 1 <= n_dims <= MAX_TENSOR_DIMS:
            raise ModelLoadError(
                f"{self.path}: GGUF tensor {name!r} has {n_dims} dimensions "
                f"(1 to {MAX_TENSOR_DIMS} allowed)"
            )
        dims = [cur.u64() for _ in range(n_dims)]
        if 0 in dims:
            raise ModelLoadError(f"{self.path}: GGUF tensor {name!r} has an empty dimension")
        return name, tuple(reversed(dims)), cur.u32(), cur.u64()

    def _place_tensors(
        self, records: list[tuple[str, tuple[int, ...], int, int]], data_start: int, size: int
    ) -> dict[str, GGUFTensorInfo]:
        """Check every tensor lies aligned, whole and alone inside the data section."""
        from inferd.loader.gguf_quants import BLOCK_LAYOUT, tensor_nbytes, type_name

        tensors: dict[str, GGUFTensorInfo] = {}
        for name, shape, ggml_type, rel in records:
            if name in tensors:
                raise ModelLoadError(f"{self.path}: GGUF tensor {name!r} appears twice")
            try:
                n_bytes = tensor_nbytes(ggml_type, shape, name)
            except ModelLoadError as e:
                raise ModelLoadError(f"{self.path}: {e}") from e
            block = BLOCK_LAYOUT[ggml_type][0]
            if shape[-1] % block:
                raise ModelLoadError(
                    f"{self.path}: GGUF tensor {name!r}: rows of {shape[-1]} weights are not "
                    f"whole {type_name(ggml_type)} blocks of {block}"
                )
            if rel % self.alignment:
                raise ModelLoadError(
                    f"{self.path}: GGUF tensor {name!r} starts at data offset {rel}, "
                    f"not a multiple of the alignment {self.alignment}"
                )
            offset = data_start + rel
            if offset + n_bytes > size:
                raise ModelLoadError(
                    f"{self.path}: truncated GGUF: tensor {name!r} ends at byte "
                    f"{offset + n_bytes} but the file has {size} bytes"
                )
            tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, n_bytes)
        by_offset = sorted(tensors.values(), key=lambda t: t.offset)
        for before, after in zip(by_offset, by_offset[1:], strict=False):
            if after.offset < before.offset + before.n_bytes:
                raise ModelLoadError(
                    f"{self.path}: GGUF tensors {before.name!r} and {after.name!r} overlap"
                )
        return tensors

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array backed by the file mapping."""
        info = self.tensors[name]
        return np.frombuffer(self._buf, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))
