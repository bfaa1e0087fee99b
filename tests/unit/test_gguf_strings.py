"""GGUF string arrays decoded on access (loader/gguf_strings.py) read as the eager parser did:
the same strings, invalid UTF-8 replaced, truncation refused; their encoded bytes are the
file's own, and the same as `encode_strings` of the decoded list."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import _Cursor
from inferd.loader.gguf_strings import StringArray, encode_strings

STRING = 8


def encoded(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(b)) + b for b in items)


def parse(items: list[bytes], tail: bytes = b"", count: int | None = None) -> StringArray:
    body = struct.pack("<IQ", STRING, len(items) if count is None else count) + encoded(items)
    cursor = _Cursor(memoryview(b"\x07" + body + tail), Path("t.gguf"))
    cursor.pos = 1
    out = cursor.array("k", 1)
    assert cursor.pos == 1 + len(body)  # the cursor moved past the whole array
    return out


RAW = [b"<unk>", b"", "\u2581caf\u00e9".encode(), b"ab\xffc", "\U0001f600".encode()]
EAGER = [b.decode("utf-8", "replace") for b in RAW]


def test_reads_every_string_as_the_eager_parser_did():
    strings = parse(RAW, tail=b"rest")
    assert isinstance(strings, StringArray) and len(strings) == 5
    assert list(strings) == EAGER and strings == EAGER and EAGER == strings
    assert [strings[i] for i in range(5)] == EAGER and strings[-1] == EAGER[-1]
    assert strings[1:4] == EAGER[1:4] and strings[::-2] == EAGER[::-2]
    assert "ab\ufffdc" in strings and strings.index("") == 1
    assert strings != EAGER[:4] and strings != [*EAGER[:4], "x"]
    with pytest.raises(IndexError):
        strings[5]


def test_encoded_bytes_are_the_files_and_match_encode_strings():
    strings = parse(RAW, tail=b"rest")
    assert bytes(strings.encoded()) == encoded(RAW)
    valid = [s for s in EAGER if "\ufffd" not in s]
    assert bytes(parse([s.encode() for s in valid]).encoded()) == encode_strings(valid)
    assert encode_strings(strings) == encoded(RAW)


def test_empty_array():
    strings = parse([])
    assert len(strings) == 0 and list(strings) == [] and bytes(strings.encoded()) == b""


def test_a_truncated_array_is_refused():
    with pytest.raises(ModelLoadError, match="truncated"):
        parse([b"abc", b"def"], count=3)
    body = struct.pack("<IQ", STRING, 1) + struct.pack("<Q", 10) + b"abc"
    cursor = _Cursor(memoryview(body), Path("t.gguf"))
    with pytest.raises(ModelLoadError, match="truncated"):
        cursor.array("k", 1)
