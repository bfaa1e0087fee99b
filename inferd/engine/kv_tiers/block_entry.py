"""One KV block as a file: a fixed header, then the block's bytes.

    magic "INFERDKV" | format u32 | identity 32 B | block hash 32 B | payload bytes u64 | crc32 u32
    payload: the block of every KV group, every tensor of the group in order (`ModelRunner
             .read_blocks`), as the pool holds it

The identity names what computed the block (weights, dtypes, KV layout, inferd's version:
`connector.store_identity`), the block hash which tokens (inferd/block_hashes.py). A reader
checks all of them and the CRC-32 of the payload before anything reaches the pool: a file from
another model, a renamed file, a truncated or damaged one is refused (`EntryRefused`), never
served. CRC-32, as the weight cache (inferd/cache.py): the threat is damage, and it runs at
GB/s, so checking every block read costs little next to reading it.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"INFERDKV"
FORMAT = 1
_HEADER = struct.Struct("<8sI32s32sQI")
HEADER_BYTES = _HEADER.size


class EntryRefused(ValueError):
    """A block file that must not be served; the message says why."""


def encode_header(identity: bytes, block_hash: bytes, payload: memoryview) -> bytes:
    crc = zlib.crc32(payload)
    return _HEADER.pack(MAGIC, FORMAT, identity, block_hash, payload.nbytes, crc)


def check_entry(data: bytes | bytearray | memoryview, identity: bytes, block_hash: bytes,
                payload_bytes: int) -> memoryview:  # fmt: skip
    """The payload of a whole entry file's bytes, after every check; raises EntryRefused."""
    view = memoryview(data)
    if view.nbytes < HEADER_BYTES:
        raise EntryRefused(f"{view.nbytes} bytes: shorter than a header")
    magic, fmt, ident, stored_hash, size, crc = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise EntryRefused("not a KV block file")
    if fmt != FORMAT:
        raise EntryRefused(f"format {fmt}, this inferd reads {FORMAT}")
    if ident != identity:
        raise EntryRefused("computed by another model or configuration")
    if stored_hash != block_hash:
        raise EntryRefused("holds another block than its name says")
    if size != payload_bytes or view.nbytes != HEADER_BYTES + size:
        raise EntryRefused(f"{view.nbytes - HEADER_BYTES} payload bytes, expected {payload_bytes}")
    payload = view[HEADER_BYTES:]
    if zlib.crc32(payload) != crc:
        raise EntryRefused("checksum mismatch")
    return payload
