"""A GGUF metadata array of strings, decoded on access from the file's mapping.

A vocabulary is 100k+ strings (262k for Gemma): as Python strings it costs ~27 MB of resident
memory for as long as the file is open, and decoding it ~0.1 s of every start, although a warm
start reads none of it (the tokenizer comes from its cache, keyed by `encoded()`'s bytes) and a
running engine only ever looks a few up. So the parser records where each string lies and this
sequence decodes a string only when it is read, exactly as the eager parser did (UTF-8, invalid
bytes replaced).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


class StringArray(Sequence[str]):
    """Strings `buf[starts[i]:ends[i]]`; `span`: the array's bytes in the file (every string's
    8-byte little-endian length, then its bytes). Each string ends where the next one's length
    begins, so one array of starts (plus where the last string ends) says where all lie: 4
    bytes per string where the file's header fits in 4 GiB, else 8."""

    __slots__ = ("_buf", "_bounds", "_span")

    def __init__(self, buf: memoryview, starts: np.ndarray, stop: int, span: slice):
        bounds = np.append(np.asarray(starts, dtype=np.int64), stop + 8)
        fits = stop + 8 < 1 << 32
        self._buf, self._span = buf, span
        self._bounds = bounds.astype(np.uint32) if fits else bounds

    def __len__(self) -> int:
        return len(self._bounds) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"string index {index} out of range for {n} strings")
        index %= n
        start, end = int(self._bounds[index]), int(self._bounds[index + 1]) - 8
        return str(self._buf[start:end], "utf-8", "replace")

    def __iter__(self) -> Iterator[str]:
        buf, bounds = self._buf, self._bounds.tolist()
        for start, after in zip(bounds[:-1], bounds[1:], strict=True):
            yield str(buf[start : after - 8], "utf-8", "replace")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  (equal to a list, which has none)

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"

    def encoded(self) -> memoryview:
        """The array's bytes as the file stores them (each string's length, then its UTF-8):
        unambiguous, and read without decoding anything. `encode_strings` gives the same
        bytes for a list of strings."""
        return self._buf[self._span]


def encode_strings(strings: Sequence[str]) -> bytes:
    """The GGUF encoding of `strings` (what `StringArray.encoded` returns for a file's array)."""
    if isinstance(strings, StringArray):
        return bytes(strings.encoded())
    parts = []
    for s in strings:
        data = s.encode("utf-8", "surrogatepass")
        parts += (len(data).to_bytes(8, "little"), data)
    return b"".join(parts)
