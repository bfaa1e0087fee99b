"""An HF checkpoint folder is untrusted input: a config.json with a missing, mistyped or
out-of-range key, a shard index pointing outside the folder, or a safetensors file whose
header lies (length, offsets, dtype) each fails with one `ModelLoadError` line naming the file
and the problem; the CLI exits 2 with that line and no traceback."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from inferd.errors import ModelLoadError
from inferd.loader import hf_dir, open_checkpoint

VOCAB, HIDDEN, HEADS, KV_HEADS, INTER = 16, 8, 2, 1, 16
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def tensors() -> dict[str, torch.Tensor]:
    head_dim = HIDDEN // HEADS
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "model.layers.0.input_layernorm.weight": (HIDDEN,),
        "model.layers.0.post_attention_layernorm.weight": (HIDDEN,),
        "model.layers.0.self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
        "model.layers.0.mlp.gate_proj.weight": (INTER, HIDDEN),
        "model.layers.0.mlp.up_proj.weight": (INTER, HIDDEN),
        "model.layers.0.mlp.down_proj.weight": (HIDDEN, INTER),
    }
    return {name: torch.full(shape, 0.01) for name, shape in shapes.items()}


def write_checkpoint(folder: Path, config: object = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(CONFIG if config is None else config)
    (folder / "config.json").write_text(text)
    save_file(tensors(), str(folder / "model.safetensors"))
    return folder


def config_with(**changes) -> dict:
    config = dict(CONFIG)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


# name → (config.json content, words the error must contain)
CONFIG_CASES: dict[str, tuple[object, str]] = {
    "no hidden_size": (config_with(hidden_size=None), "required key 'hidden_size' is missing"),
    "hidden_size a string": (config_with(hidden_size="8"), "hidden_size must be an integer"),
    "hidden_size a boolean": (config_with(hidden_size=True), "hidden_size must be an integer"),
    "hidden_size fractional": (config_with(hidden_size=8.5), "hidden_size must be an integer"),
    "zero heads": (config_with(num_attention_heads=0), "num_attention_heads must be an integer"),
    "a billion layers": (config_with(num_hidden_layers=10**9), "num_hidden_layers must be"),
    "heads do not divide hidden": (config_with(num_attention_heads=3), "not a multiple"),
    "kv heads do not divide heads": (config_with(num_key_value_heads=3), "not a multiple"),
    "negative epsilon": (config_with(rms_norm_eps=-1), "rms_norm_eps must be a positive number"),
    "rope_theta a string": (config_with(rope_theta="big"), "rope_theta must be a positive"),
    "rope_scaling a list": (config_with(rope_scaling=[8.0]), "rope_scaling must be an object"),
    "llama3 scaling without factor": (
        config_with(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0}),
        "rope_scaling: required key 'factor' is missing",
    ),
    "unsupported rope type": (
        config_with(rope_scaling={"rope_type": "longrope", "factor": 2.0}),
        "rope_type must be one of linear, llama3, yarn",
    ),
    "layer_types too short": (
        config_with(layer_types=["full_attention"] * 2),
        "layer_types has 2 entries for 1 layers",
    ),
    "eos id a string": (config_with(eos_token_id="</s>"), "eos_token_id must be a token id"),
    "architectures a string": (
        config_with(architectures="LlamaForCausalLM"),
        "architectures must be a list",
    ),
    "config a list": ([CONFIG], "expected a JSON object"),
    "config not JSON": ("{hidden_size: 8", "cannot read JSON"),
    "config wider than the tensors": (
        config_with(hidden_size=1 << 30, head_dim=4),
        "config and weights disagree",
    ),
    "more layers than stored": (
        config_with(num_hidden_layers=4),
        "the config has 4 layers, the checkpoint stores layers 0 to 0",
    ),
}


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_bad_config_json_is_one_clear_error(tmp_path, name):
    content, words = CONFIG_CASES[name]
    folder = write_checkpoint(tmp_path / "model", content)
    with pytest.raises(ModelLoadError) as err:
        open_checkpoint(folder)
    message = str(err.value)
    assert words in message and str(folder) in message and "\n" not in message, message


def test_the_valid_checkpoint_opens(tmp_path):
    checkpoint = open_checkpoint(write_checkpoint(tmp_path / "model"))
    assert (checkpoint.config.hidden_size, checkpoint.config.head_dim) == (HIDDEN, HIDDEN // HEADS)


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "", 3])
def test_shard_index_cannot_point_outside_the_folder(tmp_path, target):
    folder = write_checkpoint(tmp_path / "model")
    index = {"weight_map": {"model.embed_tokens.weight": target}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="must name a file in the folder"):
        open_checkpoint(folder)


# ---- safetensors headers ------------------------------------------------------------------------
def read_raw(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def write_raw(path: Path, header: object, body: bytes, length: int | None = None) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + body)


def first_two(header: dict) -> tuple[str, str]:
    """The names of the first two tensors in data order."""
    names = [n for n in header if n != "__metadata__"]
    names.sort(key=lambda n: header[n]["data_offsets"])
    return names[0], names[1]


def set_entry(field: str, value) -> Callable[[dict, bytes], tuple[object, bytes]]:
    def edit(header: dict, body: bytes) -> tuple[object, bytes]:
        header[first_two(header)[0]][field] = value
        return header, body

    return edit


def overlap(header: dict, body: bytes) -> tuple[object, bytes]:
    first, second = first_two(header)
    end = header[second]["data_offsets"][1]
    header[second]["data_offsets"] = [0, end - header[first]["data_offsets"][1]]
    return header, body


def gap(header: dict, body: bytes) -> tuple[object, bytes]:
    for name, entry in header.items():
        if name != "__metadata__":
            entry["data_offsets"] = [o + 4 for o in entry["data_offsets"]]
    return header, bytes(4) + body


def duplicate_key(header: dict, body: bytes) -> tuple[object, bytes]:
    text = json.dumps(header)
    name = first_two(header)[0]
    return (text[:-1] + f", {json.dumps(name)}: {json.dumps(header[name])}}}").encode(), body


# name → (edit of the valid header and body, words the error must contain)
SAFETENSORS_CASES: dict[str, tuple[Callable, str]] = {
    "negative offset": (set_entry("data_offsets", [-4, 60]), "data_offsets must be [begin, end]"),
    "begin after end": (set_entry("data_offsets", [64, 0]), "data_offsets must be [begin, end]"),
    "overlapping tensors": (overlap, "overlaps"),
    "gap before the data": (gap, "leaves a gap"),
    "dtype does not match the bytes": (set_entry("dtype", "F16"), "does not match the data"),
    "shape does not match the bytes": (set_entry("shape", [3, 3]), "does not match the data"),
    "unknown dtype": (set_entry("dtype", "F7"), "unsupported dtype 'F7'"),
    "negative dimension": (set_entry("shape", [-1, 8]), "non-negative integers"),
    "data cut short": (lambda h, b: (h, b[:-8]), "truncated file or bad data_offsets"),
    "header not JSON": (lambda h, b: (b"{not json", b), "not valid JSON"),
    "header a list": (lambda h, b: (b"[1, 2]", b), "not a JSON object"),
    "duplicate tensor name": (duplicate_key, "appears twice"),
    "metadata not strings": (
        lambda h, b: ({**h, "__metadata__": {"format": 1}}, b),
        "__metadata__ must map strings to strings",
    ),
}


@pytest.mark.parametrize("name", list(SAFETENSORS_CASES))
def test_crafted_safetensors_header_is_one_clear_error(tmp_path, name):
    folder = write_checkpoint(tmp_path / "model")
    shard = folder / "model.safetensors"
    edit, words = SAFETENSORS_CASES[name]
    write_raw(shard, *edit(*read_raw(shard)))
    for attempt in (lambda: open_checkpoint(folder), lambda: list(hf_dir.hf_weights(folder))):
        with pytest.raises(ModelLoadError) as err:
            attempt()
        message = str(err.value)
        assert words in message and str(shard) in message and "\n" not in message, message


@pytest.mark.parametrize("length", [1 << 62, 10_000])
def test_header_length_larger_than_the_file(tmp_path, length):
    folder = write_checkpoint(tmp_path / "model")
    shard = folder / "model.safetensors"
    header, body = read_raw(shard)
    write_raw(shard, header, body, length=length)
    with pytest.raises(ModelLoadError, match="header length .* exceeds the file"):
        open_checkpoint(folder)


def test_file_too_short_and_tensor_in_two_shards(tmp_path):
    folder = write_checkpoint(tmp_path / "model")
    (folder / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ModelLoadError, match="too short"):
        open_checkpoint(folder)
    folder = write_checkpoint(tmp_path / "sharded")
    save_file({"model.norm.weight": torch.ones(HIDDEN)}, str(folder / "extra.safetensors"))
    with pytest.raises(ModelLoadError, match="'model.norm.weight' is stored twice"):
        open_checkpoint(folder)


def test_cli_one_line_exit_2(tmp_path):
    folder = write_checkpoint(tmp_path / "model", config_with(hidden_size=None))
    res = subprocess.run(
        [sys.executable, "-m", "inferd", "generate", "hi", "--model", str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert "required key 'hidden_size' is missing" in res.stderr and res.stdout == ""
