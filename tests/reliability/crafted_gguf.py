"""Byte-level GGUF writing for the crafted-file tests: a valid tiny Llama-shaped model (one
layer, F32, a 12-token vocabulary) whose every part a test can replace with something wrong.

Written by hand rather than with the `gguf` package, which refuses to write most of the
damage these tests need (alignment 0, nested arrays, lying counts, overlapping tensors).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12
F32, Q8_0 = 0, 8
_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
            FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}  # fmt: skip

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 12, 8, 2, 1, 4, 16
TOKENS = ["<unk>", "<s>", "</s>", "<start>", "a", "b", "c", " ", "ab", "abc", " a", "ca"]
TOKEN_TYPES = [2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]  # unknown, control x3, normal


def string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: Any) -> bytes:
    """A typed value without its type tag; arrays are (item type, list of values)."""
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        item_type, items = v
        body = b"".join(value(item_type, item) for item in items)
        return struct.pack("<IQ", item_type, len(items)) + body
    return struct.pack(_FORMATS[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return string(key) + struct.pack("<I", vtype) + value(vtype, v)


def tensor_info(name: str, ne: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    dims = b"".join(struct.pack("<Q", d) for d in ne)
    return string(name) + struct.pack("<I", len(ne)) + dims + struct.pack("<IQ", ggml_type, offset)


@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]  # GGUF order: innermost dimension first
    ggml_type: int = F32
    offset: int | None = None  # None: placed after the previous placed tensor, aligned

    @property
    def n_bytes(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n * 4 if self.ggml_type == F32 else n // 32 * 34


def tiny_metadata() -> dict[str, tuple[int, Any]]:
    return {
        "general.architecture": (STRING, "llama"),
        "general.name": (STRING, "tiny"),
        "llama.block_count": (UINT32, 1),
        "llama.context_length": (UINT32, 64),
        "llama.embedding_length": (UINT32, HIDDEN),
        "llama.feed_forward_length": (UINT32, INTER),
        "llama.attention.head_count": (UINT32, HEADS),
        "llama.attention.head_count_kv": (UINT32, KV_HEADS),
        "llama.rope.freq_base": (FLOAT32, 10000.0),
        "llama.attention.layer_norm_rms_epsilon": (FLOAT32, 1e-5),
        "tokenizer.ggml.model": (STRING, "llama"),
        "tokenizer.ggml.tokens": (ARRAY, (STRING, TOKENS)),
        "tokenizer.ggml.scores": (ARRAY, (FLOAT32, [0.0] * 4 + [-float(i) for i in range(8)])),
        "tokenizer.ggml.token_type": (ARRAY, (INT32, TOKEN_TYPES)),
        "tokenizer.ggml.bos_token_id": (UINT32, 1),
        "tokenizer.ggml.eos_token_id": (UINT32, 2),
        "tokenizer.ggml.unknown_token_id": (UINT32, 0),
    }


def tiny_tensors() -> list[Tensor]:
    q, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return [
        Tensor("token_embd.weight", (HIDDEN, VOCAB)),
        Tensor("output_norm.weight", (HIDDEN,)),
        Tensor("blk.0.attn_norm.weight", (HIDDEN,)),
        Tensor("blk.0.attn_q.weight", (HIDDEN, q)),
        Tensor("blk.0.attn_k.weight", (HIDDEN, kv_rows)),
        Tensor("blk.0.attn_v.weight", (HIDDEN, kv_rows)),
        Tensor("blk.0.attn_output.weight", (q, HIDDEN)),
        Tensor("blk.0.ffn_norm.weight", (HIDDEN,)),
        Tensor("blk.0.ffn_gate.weight", (HIDDEN, INTER)),
        Tensor("blk.0.ffn_up.weight", (HIDDEN, INTER)),
        Tensor("blk.0.ffn_down.weight", (INTER, HIDDEN)),
    ]


@dataclass
class GGUFSpec:
    """Everything a file is written from; tests edit a default one before `to_bytes`."""

    metadata: dict[str, tuple[int, Any]] = field(default_factory=tiny_metadata)
    tensors: list[Tensor] = field(default_factory=tiny_tensors)
    alignment: int = 32  # used to place tensors; general.alignment is written only if set
    version: int = 3
    n_kv: int | None = None  # None: the true counts
    n_tensors: int | None = None
    extra_kv: bytes = b""  # raw entries appended after `metadata` (counted in n_kv)
    extra_kv_count: int = 0

    def to_bytes(self) -> bytes:
        header = b"GGUF" + struct.pack("<I", self.version)
        n_kv = len(self.metadata) + self.extra_kv_count if self.n_kv is None else self.n_kv
        n_t = len(self.tensors) if self.n_tensors is None else self.n_tensors
        header += struct.pack("<QQ", n_t, n_kv)
        header += b"".join(kv(k, t, v) for k, (t, v) in self.metadata.items()) + self.extra_kv
        infos, data, position = [], b"", 0
        for t in self.tensors:
            if t.offset is not None:  # placed by the test: the data is not grown for it
                infos.append(tensor_info(t.name, t.ne, t.ggml_type, t.offset))
                continue
            infos.append(tensor_info(t.name, t.ne, t.ggml_type, position))
            position += t.n_bytes
            position = (position + self.alignment - 1) // self.alignment * self.alignment
        header += b"".join(infos)
        pad = (-len(header)) % self.alignment
        data = bytes(position)
        # Small distinct floats: a valid model whatever the reader does with them.
        floats = struct.pack(f"<{position // 4}f", *[0.01 * (i % 7) for i in range(position // 4)])
        data = floats + data[len(floats) :]
        return header + bytes(pad) + data
