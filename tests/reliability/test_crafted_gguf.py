"""A GGUF file is untrusted input: each damaged or hostile file below fails to open with one
`ModelLoadError` line naming the file and the problem (never a ZeroDivisionError, a
RecursionError, a huge allocation or a traceback), and the CLI exits 2 with that line."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crafted_gguf import (
    ARRAY,
    BOOL,
    F32,
    FLOAT32,
    INT32,
    Q8_0,
    STRING,
    UINT8,
    UINT32,
    GGUFSpec,
    Tensor,
    kv,
)

from inferd.errors import ModelLoadError
from inferd.loader import open_checkpoint
from inferd.tokenizer import Tokenizer


def nested_arrays(depth: int) -> bytes:
    """One metadata entry: an array of an array of ... `depth` levels, innermost empty."""
    outer = struct.pack("<Q", 6) + b"nested" + struct.pack("<I", ARRAY)
    return outer + struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT8, 0)


def raw_entry(key: str, vtype: int, payload: bytes) -> Callable[[GGUFSpec], None]:
    """Append one metadata entry written byte by byte (counts that lie, unknown types)."""

    def add(spec: GGUFSpec) -> None:
        spec.extra_kv = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype)
        spec.extra_kv += payload
        spec.extra_kv_count = 1

    return add


def set_meta(key: str, vtype: int, value) -> Callable[[GGUFSpec], None]:
    return lambda spec: spec.metadata.__setitem__(key, (vtype, value))


def edit_tensor(index: int, **changes) -> Callable[[GGUFSpec], None]:
    def edit(spec: GGUFSpec) -> None:
        for name, value in changes.items():
            setattr(spec.tensors[index], name, value)

    return edit


def nested(spec: GGUFSpec) -> None:
    spec.extra_kv, spec.extra_kv_count = nested_arrays(50_000), 1


def duplicate_key(spec: GGUFSpec) -> None:
    spec.extra_kv, spec.extra_kv_count = kv("general.name", STRING, "again"), 1


def duplicate_tensor(spec: GGUFSpec) -> None:
    spec.tensors.append(Tensor("output_norm.weight", (8,)))


def overlap(spec: GGUFSpec) -> None:
    spec.tensors[2].offset = spec.tensors[1].offset = 64


# name → (how to damage the default file, words the one-line error must contain)
CASES: dict[str, tuple[Callable[[GGUFSpec], None], str]] = {
    "alignment 0": (set_meta("general.alignment", UINT32, 0), "general.alignment"),
    "alignment not a power of two": (set_meta("general.alignment", UINT32, 48), "power of two"),
    "alignment absurd": (set_meta("general.alignment", UINT32, 1 << 30), "power of two"),
    "arrays nested 50,000 deep": (nested, "nested more than 4 deep"),
    "metadata count lies": (lambda s: setattr(s, "n_kv", 1 << 40), "metadata entries"),
    "tensor count lies": (lambda s: setattr(s, "n_tensors", 1 << 40), "tensors"),
    "array count lies": (
        raw_entry("lying", ARRAY, struct.pack("<IQ", UINT8, 1 << 60)),
        "claims 1152921504606846976 values in 'lying'",
    ),
    "string length lies": (raw_entry("long", STRING, struct.pack("<Q", 1 << 60)), "truncated"),
    "unknown value type": (raw_entry("odd", 99, bytes(8)), "unknown value type 99"),
    "duplicate key": (duplicate_key, "appears twice"),
    "duplicate tensor": (duplicate_tensor, "appears twice"),
    "string where a count belongs": (
        set_meta("llama.embedding_length", STRING, "640"),
        "llama.embedding_length must be a positive integer",
    ),
    "zero heads": (set_meta("llama.attention.head_count", UINT32, 0), "head_count"),
    "array where a float belongs": (
        set_meta("llama.rope.freq_base", ARRAY, (FLOAT32, [1.0])),
        "llama.rope.freq_base must be a positive finite number",
    ),
    "negative epsilon": (
        set_meta("llama.attention.layer_norm_rms_epsilon", FLOAT32, -1.0),
        "layer_norm_rms_epsilon",
    ),
    "token id of the wrong type": (
        set_meta("tokenizer.ggml.bos_token_id", STRING, "<s>"),
        "tokenizer.ggml.bos_token_id must be a token id",
    ),
    "tokens that are not strings": (
        set_meta("tokenizer.ggml.tokens", ARRAY, (INT32, [1, 2])),
        "tokenizer.ggml.tokens must be an array of strings",
    ),
    "per-token array too short": (
        set_meta("tokenizer.ggml.token_type", ARRAY, (INT32, [1, 1])),
        "has 2 entries for 12 tokens",
    ),
    "boolean flag of the wrong type": (
        set_meta("tokenizer.ggml.add_bos_token", UINT32, 7),
        "add_bos_token must be a boolean",
    ),
    "five dimensions": (edit_tensor(1, ne=(1, 1, 1, 1, 8)), "has 5 dimensions"),
    "empty dimension": (edit_tensor(1, ne=(8, 0)), "empty dimension"),
    "unknown tensor type": (edit_tensor(1, ggml_type=99), "ggml type 99"),
    "rows not whole blocks": (edit_tensor(1, ggml_type=Q8_0, ne=(16, 2)), "whole Q8_0 blocks"),
    "offset past the end": (edit_tensor(3, offset=1 << 20), "ends at byte"),
    "unaligned offset": (edit_tensor(3, offset=36), "not a multiple of the alignment 32"),
    "overlapping tensors": (overlap, "overlap"),
    "config wider than the tensors": (
        set_meta("llama.embedding_length", UINT32, 1 << 30),
        "config and weights disagree",
    ),
    "more layers than stored": (
        set_meta("llama.block_count", UINT32, 1000),
        "the config has 1000 layers, the checkpoint stores layers 0 to 0",
    ),
    "unsupported version": (lambda s: setattr(s, "version", 1), "unsupported GGUF version 1"),
}


def write_case(tmp_path: Path, name: str) -> Path:
    spec = GGUFSpec()
    damage, _ = CASES[name]
    damage(spec)
    path = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.gguf"
    path.write_bytes(spec.to_bytes())
    return path


def test_the_undamaged_file_opens_and_tokenizes(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(GGUFSpec().to_bytes())
    checkpoint = open_checkpoint(path)
    assert (checkpoint.config.hidden_size, checkpoint.config.num_layers) == (8, 1)
    tok = Tokenizer.from_gguf(checkpoint.gguf, cache=False)
    assert tok.bos_token_id == 1 and tok.convert_ids_to_tokens(tok.encode("abc"))[1] == "abc"


@pytest.mark.parametrize("name", list(CASES))
def test_damaged_gguf_is_one_clear_error(tmp_path, name):
    path = write_case(tmp_path, name)
    with pytest.raises(ModelLoadError) as err:
        open_checkpoint(path)
    message = str(err.value)
    assert str(path) in message and CASES[name][1] in message, message
    assert "\n" not in message


def test_flag_types_checked(tmp_path):
    # A boolean flag stored as a boolean is fine (the check is on type, not presence).
    spec = GGUFSpec()
    spec.metadata["tokenizer.ggml.add_bos_token"] = (BOOL, True)
    path = tmp_path / "ok.gguf"
    path.write_bytes(spec.to_bytes())
    assert open_checkpoint(path).gguf.get("tokenizer.ggml.add_bos_token") is True


def run_cli(path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferd", *flags, "generate", "hi", "--model", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_one_line_exit_2_and_traceback_only_in_debug(tmp_path):
    for name in ("alignment 0", "arrays nested 50,000 deep"):
        path = write_case(tmp_path, name)
        res = run_cli(path)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
        assert str(path) in res.stderr and CASES[name][1] in res.stderr
    res = run_cli(path, "--log-level", "debug")
    assert res.returncode == 2 and "Traceback" in res.stderr
    assert res.stderr.count("\n") < 100  # a bounded traceback, not thousands of frames


def test_tensor_of_f32_type_is_placed_exactly(tmp_path):
    # The reader's idea of each tensor's bytes is the writer's (offset, size): nothing shifted.
    spec = GGUFSpec()
    path = tmp_path / "tiny.gguf"
    path.write_bytes(spec.to_bytes())
    gguf = open_checkpoint(path).gguf
    info = gguf.tensors["blk.0.attn_q.weight"]
    assert info.ggml_type == F32 and info.n_bytes == 8 * 8 * 4 and info.offset % 32 == 0
