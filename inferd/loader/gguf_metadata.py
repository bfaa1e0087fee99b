"""The types and ranges GGUF metadata keys must have, checked once when a file is opened.

A GGUF file is untrusted input: any key may hold any type (a string where a count belongs, an
array where a float belongs, zero heads). Every key inferd reads is checked here against the
type the GGUF specification gives it, so the code that builds a model config or a tokenizer
can `int()` and index what it reads without meeting a TypeError or a division by zero. Keys
inferd never reads are left alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from inferd.errors import ModelLoadError
from inferd.loader.gguf_strings import StringArray

# Upper bound for sizes (widths, context): far above any real model, low enough that a product
# of a few of them cannot overflow a tensor size computation.
MAX_DIMENSION = 1 << 31
# Upper bound for layer and head counts: configs are expanded into per-layer Python lists before
# any tensor is compared with them, so a count of 2^31 would exhaust memory on its own.
MAX_COUNT = 1 << 16
# Token ids are int32 everywhere downstream.
MAX_TOKEN_ID = (1 << 31) - 1

POSITIVE_INT, NON_NEGATIVE_INT, POSITIVE_FLOAT, STRING, BOOL = "pi", "ni", "pf", "s", "b"
STRING_LIST, INT_ARRAY, FLOAT_ARRAY, TOKEN_ID, COUNT = "sl", "ia", "fa", "id", "c"

_KIND_WORDS = {
    POSITIVE_INT: "a positive integer",
    COUNT: f"an integer from 1 to {MAX_COUNT}",
    NON_NEGATIVE_INT: "a non-negative integer",
    POSITIVE_FLOAT: "a positive finite number",
    STRING: "a string",
    BOOL: "a boolean",
    STRING_LIST: "an array of strings",
    INT_ARRAY: "an array of integers",
    FLOAT_ARRAY: "an array of numbers",
    TOKEN_ID: "a token id (integer from 0 to 2^31-1)",
}

# Keys under the architecture's namespace (`{general.architecture}.<suffix>`).
ARCH_KEYS = {
    "context_length": POSITIVE_INT,
    "embedding_length": POSITIVE_INT,
    "block_count": COUNT,
    "feed_forward_length": POSITIVE_INT,
    "attention.head_count": COUNT,
    "attention.head_count_kv": COUNT,
    "attention.key_length": POSITIVE_INT,
    "attention.value_length": POSITIVE_INT,
    "attention.sliding_window": NON_NEGATIVE_INT,  # 0: no sliding window
    "attention.layer_norm_rms_epsilon": POSITIVE_FLOAT,
    "rope.freq_base": POSITIVE_FLOAT,
    "rope.scaling.factor": POSITIVE_FLOAT,
    "rope.scaling.type": STRING,
    "rope.scaling.original_context_length": POSITIVE_INT,
    "rope.scaling.yarn_beta_fast": POSITIVE_FLOAT,
    "rope.scaling.yarn_beta_slow": POSITIVE_FLOAT,
    "expert_count": COUNT,
    "expert_used_count": COUNT,
    "expert_feed_forward_length": POSITIVE_INT,
    "expert_shared_feed_forward_length": NON_NEGATIVE_INT,
    "expert_weights_norm": BOOL,
}
GLOBAL_KEYS = {
    "general.architecture": STRING,
    "general.name": STRING,
    "general.alignment": POSITIVE_INT,
    "tokenizer.ggml.model": STRING,
    "tokenizer.ggml.pre": STRING,
    "tokenizer.ggml.tokens": STRING_LIST,
    "tokenizer.ggml.token_type": INT_ARRAY,
    "tokenizer.ggml.scores": FLOAT_ARRAY,
    "tokenizer.ggml.merges": STRING_LIST,
    "tokenizer.ggml.bos_token_id": TOKEN_ID,
    "tokenizer.ggml.eos_token_id": TOKEN_ID,
    "tokenizer.ggml.unknown_token_id": TOKEN_ID,
    "tokenizer.ggml.padding_token_id": TOKEN_ID,
    "tokenizer.ggml.eot_token_id": TOKEN_ID,
    "tokenizer.ggml.eom_token_id": TOKEN_ID,
    "tokenizer.ggml.add_bos_token": BOOL,
    "tokenizer.ggml.add_eos_token": BOOL,
    "tokenizer.chat_template": STRING,
}
# Per-token arrays must have one entry per token.
_PER_TOKEN_KEYS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _conforms(value: Any, kind: str) -> bool:
    if kind in (POSITIVE_INT, NON_NEGATIVE_INT):
        low = 1 if kind == POSITIVE_INT else 0
        return _is_int(value) and low <= value <= MAX_DIMENSION
    if kind == COUNT:
        return _is_int(value) and 1 <= value <= MAX_COUNT
    if kind == TOKEN_ID:
        return _is_int(value) and 0 <= value <= MAX_TOKEN_ID
    if kind == POSITIVE_FLOAT:
        number = _is_int(value) or isinstance(value, float | np.floating)
        return number and math.isfinite(value) and value > 0
    if kind == STRING:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool | np.bool_)
    if kind == STRING_LIST:
        if isinstance(value, StringArray):
            return True  # its items are strings by construction
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == INT_ARRAY:
        return isinstance(value, np.ndarray) and value.dtype.kind in "iu"
    if kind == FLOAT_ARRAY:
        return isinstance(value, np.ndarray) and value.dtype.kind in "iuf"
    raise AssertionError(kind)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    if isinstance(value, list):
        return "an array"
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} {text[:37]}..."


def check_metadata(metadata: dict[str, Any], path: Path) -> None:
    """Raise ModelLoadError (naming the file and the key) for the first key inferd reads whose
    value has the wrong type or range."""
    arch = metadata.get("general.architecture")
    expected = dict(GLOBAL_KEYS)
    if isinstance(arch, str):
        expected.update({f"{arch}.{suffix}": kind for suffix, kind in ARCH_KEYS.items()})
    for key, kind in expected.items():
        if key in metadata and not _conforms(metadata[key], kind):
            raise ModelLoadError(
                f"{path}: GGUF metadata {key} must be {_KIND_WORDS[kind]}, "
                f"got {_describe(metadata[key])}"
            )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    for key in _PER_TOKEN_KEYS:
        value = metadata.get(key)
        if value is not None and (value.ndim != 1 or len(value) != len(tokens)):
            raise ModelLoadError(
                f"{path}: GGUF metadata {key} has {value.size} entries for {len(tokens)} tokens"
            )
