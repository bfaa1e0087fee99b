"""HF `config.json` → `ModelConfig`, for both the transformers 4 and 5 spellings of RoPE.

The keys every family shares are read here; the family's own (Gemma's RoPE bases, Qwen's sliding
layers, experts) by its Architecture record's `hf_fields` (inferd/models/), through the same
`ConfigReader`.

config.json is untrusted input: every key read is checked for presence, type and range, and a
bad one fails as one `ModelLoadError` naming the file and the key (never a KeyError, a
TypeError or a division by zero deep in model construction)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeConfig
from inferd.errors import ModelLoadError
from inferd.loader.gguf_metadata import MAX_COUNT, MAX_DIMENSION, MAX_TOKEN_ID
from inferd.models.registry import for_hf_classes, supported_architectures

_REQUIRED = object()
# Keys each RoPE scaling type needs (all positive numbers), as inferd's rotary layer reads them.
_ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"
    ),
    "yarn": ("factor", "original_max_position_embeddings"),
}  # fmt: skip
# Keys a scaling type may have (positive numbers when present; `truncate` true or false).
_ROPE_OPTIONAL_KEYS = {"yarn": ("beta_fast", "beta_slow", "attention_factor", "mscale",
                                "mscale_all_dim")}  # fmt: skip


class ConfigReader:
    """Typed, range-checked reads of a config dict; errors name `source` and the key."""

    def __init__(self, cfg: Any, source: str | Path):
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
        self.cfg, self.source = cfg, source

    def _get(self, key: str, default: Any) -> Any:
        value = self.cfg.get(key)
        if value is None:
            if default is _REQUIRED:
                raise ModelLoadError(f"{self.source}: required key {key!r} is missing")
            return default
        return value

    def fail(self, key: str, wanted: str, value: Any) -> ModelLoadError:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return ModelLoadError(f"{self.source}: {key} must be {wanted}, got {shown}")

    def int(self, key: str, default: Any = _REQUIRED, low: int = 1, high: int = MAX_DIMENSION):
        value = self._get(key, default)
        if value is default and default is not _REQUIRED:
            return value
        # JSON writers sometimes spell integers as 4096.0; anything else is an error.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(key, f"an integer from {low} to {high}", value)
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> Any:
        """A positive finite number."""
        value = self._get(key, default)
        if value is default and default is not _REQUIRED:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, "a positive number", value)
        if not math.isfinite(value) or value <= 0:
            raise self.fail(key, "a positive number", value)
        return float(value)

    def str(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def token_ids(self, key: str) -> tuple[int, ...]:
        value = self.cfg.get(key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_ID:
                raise self.fail(key, "a token id or a list of token ids", value)
        return tuple(values)

    def token_id(self, key: str) -> int | None:
        ids = self.token_ids(key)
        if len(ids) > 1:
            raise self.fail(key, "one token id", self.cfg.get(key))
        return ids[0] if ids else None

    def int_list(self, key: str, high: int) -> tuple[int, ...]:
        """A list of integers from 0 to `high` (layer indices); missing or null: empty."""
        value = self.cfg.get(key)
        values = [] if value is None else value
        ok = isinstance(values, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= high for v in values
        )
        if not ok:
            raise self.fail(key, f"a list of integers from 0 to {high}", value)
        return tuple(values)

    def rope(self, params: Any, theta: float | None, scaling: Any, key: str) -> RopeConfig:
        """transformers 5 writes `rope_parameters` {rope_type, rope_theta, ...} (under `key`);
        4 writes `rope_theta` plus an optional `rope_scaling` dict."""
        for name, value in ((key, params), ("rope_scaling", scaling)):
            if value is not None and not isinstance(value, dict):
                raise self.fail(name, "an object", value)
        if params:
            theta = ConfigReader(params, f"{self.source}: {key}").number("rope_theta", theta)
            kind = params.get("rope_type", params.get("type", "default"))
            scaling = None if kind == "default" else {
                k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")
            }  # fmt: skip
        elif scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        if scaling:
            where = ConfigReader(scaling, f"{self.source}: {key if params else 'rope_scaling'}")
            kind = where.str("rope_type", scaling.get("type"))
            if kind not in _ROPE_SCALING_KEYS:
                raise where.fail("rope_type", f"one of {', '.join(_ROPE_SCALING_KEYS)}", kind)
            for name in _ROPE_SCALING_KEYS[kind]:
                where.number(name)
            for name in _ROPE_OPTIONAL_KEYS.get(kind, ()):
                where.number(name, None)
            if kind == "yarn":
                where.bool("truncate", True)
        return RopeConfig(theta=float(theta if theta is not None else 10000.0), scaling=scaling)

    def sliding_everywhere(self) -> tuple[str, ...]:
        """Mistral's rule: every layer slides when `sliding_window` is set (0 or null: none)."""
        window = self.int("sliding_window", None, low=0)
        return (SLIDING_ATTENTION if window else FULL_ATTENTION,) * self.int("num_hidden_layers")


def _layer_types(r: ConfigReader, n: int) -> tuple[str, ...] | None:
    """An explicit `layer_types` list, checked; None when there is none (the family's rule
    decides, else every layer is full attention)."""
    types = r.cfg.get("layer_types")
    if not types:
        return None
    known = (FULL_ATTENTION, SLIDING_ATTENTION)
    if not isinstance(types, list) or any(t not in known for t in types):
        raise r.fail("layer_types", f"a list of {known[0]!r} / {known[1]!r}", types)
    if len(types) != n:
        raise ModelLoadError(f"{r.source}: layer_types has {len(types)} entries for {n} layers")
    return tuple(types)


def model_config_from_hf(
    cfg: dict[str, Any], name: str = "", source: str | Path = "config.json"
) -> ModelConfig:
    """`source` names the file in errors."""
    r = ConfigReader(cfg, source)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise r.fail("architectures", "a list of class names", archs)
    record = for_hf_classes([a for a in archs if isinstance(a, str)])
    if record is None:
        raise ModelLoadError(
            f"{source}: unsupported architecture {archs or cfg.get('model_type')!r}; "
            f"inferd supports: {', '.join(supported_architectures())}"
        )
    outer = r  # a vision-language checkpoint's whole file (its record's `hf_fields` read it)
    if record.hf_text_config is not None:
        cfg = cfg.get(record.hf_text_config)
        r = ConfigReader(cfg, f"{source}: {record.hf_text_config}")
    if cfg.get("mlp_bias") or (record.hf_attention_bias and cfg.get("attention_bias")):
        raise ModelLoadError(
            f"{source}: checkpoints with MLP or output-projection biases are not supported"
        )
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_COUNT)
    n_layers = r.int("num_hidden_layers", high=MAX_COUNT)
    head_dim = r.int("head_dim", None)
    if head_dim is None:
        if hidden % heads:
            raise ModelLoadError(
                f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{heads}, and there is no head_dim"
            )
        head_dim = hidden // heads
    kv_heads = r.int("num_key_value_heads", heads, high=MAX_COUNT)
    if heads % kv_heads:
        raise ModelLoadError(
            f"{source}: num_attention_heads {heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    fields: dict[str, Any] = dict(
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=r.int("intermediate_size"),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", 1e-6),
        max_position_embeddings=r.int("max_position_embeddings", 4096),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        hidden_act=r.str("hidden_activation", None) or r.str("hidden_act", None) or "silu",
        rope=r.rope(
            cfg.get("rope_parameters"),
            r.number("rope_theta", None),
            cfg.get("rope_scaling"),
            "rope_parameters",
        ),
        bos_token_id=r.token_id("bos_token_id"),
        eos_token_ids=r.token_ids("eos_token_id"),
        pad_token_id=r.token_id("pad_token_id"),
        checkpoint_dtype=r.str("dtype", None) or r.str("torch_dtype", None) or "float32",
        name=name,
    )
    try:
        fields.update(record.hf_fields(outer))
        explicit = _layer_types(r, n_layers)
        if explicit is not None:
            fields["layer_types"] = explicit
        if SLIDING_ATTENTION in fields.get("layer_types", ()):
            # 0 or null means no window: sliding layers then see every token
            fields["sliding_window"] = r.int("sliding_window", None, low=0) or None
        return ModelConfig(architecture=record.name, **fields)
    except ValueError as e:  # the configs' own consistency checks (e.g. experts per token)
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"{source}: {e}") from e
