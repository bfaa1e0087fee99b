"""Reading the GGUF container: header, metadata and tensor directory, over one memory map.

The format (little-endian): magic "GGUF", version, tensor count, metadata count, then
`key → typed value` pairs, then one record per tensor (name, dims, ggml type, offset), then the
aligned tensor data. Vocabularies are 100k+ string arrays, so strings are sliced straight out of
the map instead of going through a generic per-value reader: the whole header of the embedded
model parses in a fraction of a second.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferd.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

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

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        if vtype not in _SCALAR_FORMATS:
            raise ModelLoadError(f"{self.path}: unknown GGUF metadata type {vtype}")
        return self.scalar(vtype)

    def array(self) -> Any:
        item_type, count = self.u32(), self.u64()
        if item_type == _STRING:
            return self._string_array(count)
        if item_type == _ARRAY:
            return [self.array() for _ in range(count)]
        if item_type not in _NUMPY_DTYPES:
            raise ModelLoadError(f"{self.path}: unknown GGUF array item type {item_type}")
        dtype = np.dtype(_NUMPY_DTYPES[item_type])
        self.need(count * dtype.itemsize)
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * dtype.itemsize
        return arr

    def _string_array(self, count: int) -> list[str]:
        # NOTE: hot loop for vocabularies (262k entries for Gemma); keep it to slicing and decode.
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                self.need(n)
            append(str(buf[pos : pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (name → info) and zero-copy tensor bytes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # mmap of an empty file
            raise ModelLoadError(f"{self.path}: empty file, not a GGUF model") from e
        buf = memoryview(self._mmap)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
        cur = _Cursor(buf, self.path)
        cur.pos = 4
        self.version = cur.u32()
        if self.version not in (2, 3):
            raise ModelLoadError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = cur.u64(), cur.u64()
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.u32())
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            dims = [cur.u64() for _ in range(n_dims)]
            infos.append((name, tuple(reversed(dims)), cur.u32(), cur.u64()))
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, GGUFTensorInfo] = {}
        from inferd.loader.gguf_quants import tensor_nbytes  # local: avoids an import cycle

        for name, shape, ggml_type, rel in infos:
            n_bytes = tensor_nbytes(ggml_type, shape, name)
            offset = data_start + rel
            if offset + n_bytes > len(buf):
                raise ModelLoadError(
                    f"{self.path}: truncated GGUF: tensor {name!r} ends at byte "
                    f"{offset + n_bytes} but the file has {len(buf)} bytes"
                )
            self.tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, n_bytes)
        self._buf = buf

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array backed by the file mapping."""
        info = self.tensors[name]
        return np.frombuffer(self._buf, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))
