"""HF `config.json` → `ModelConfig`, for both the transformers 4 and 5 spellings of RoPE.

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
from inferd.models.registry import ARCHITECTURES, supported_architectures

_REQUIRED = object()
# Keys each RoPE scaling type needs (all positive numbers), as inferd's rotary layer reads them.
_ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"
    ),
}  # fmt: skip


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


def _rope(r: ConfigReader, params: Any, theta: float | None, scaling: Any, key: str) -> RopeConfig:
    """transformers 5 writes `rope_parameters` {rope_type, rope_theta, ...}; 4 writes
    `rope_theta` plus an optional `rope_scaling` dict."""
    for name, value in ((key, params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise r.fail(name, "an object", value)
    if params:
        theta = ConfigReader(params, f"{r.source}: {key}").number("rope_theta", theta)
        kind = params.get("rope_type", params.get("type", "default"))
        scaling = (
            None if kind == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        )
    elif scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    if scaling:
        where = ConfigReader(scaling, f"{r.source}: {key if params else 'rope_scaling'}")
        kind = where.str("rope_type", scaling.get("type"))
        if kind not in _ROPE_SCALING_KEYS:
            raise where.fail("rope_type", f"one of {', '.join(_ROPE_SCALING_KEYS)}", kind)
        for name in _ROPE_SCALING_KEYS[kind]:
            where.number(name)
    return RopeConfig(theta=float(theta if theta is not None else 10000.0), scaling=scaling)


def _eos_ids(r: ConfigReader) -> tuple[int, ...]:
    return r.token_ids("eos_token_id")


def _layer_types(r: ConfigReader, kind: str, n: int) -> tuple[str, ...]:
    cfg = r.cfg
    if cfg.get("layer_types"):
        types = cfg["layer_types"]
        known = (FULL_ATTENTION, SLIDING_ATTENTION)
        if not isinstance(types, list) or any(t not in known for t in types):
            raise r.fail("layer_types", f"a list of {known[0]!r} / {known[1]!r}", types)
        if len(types) != n:
            raise ModelLoadError(f"{r.source}: layer_types has {len(types)} entries for {n} layers")
        return tuple(types)
    window = r.int("sliding_window", None, low=0)
    if kind == "gemma3":
        pattern = r.int("sliding_window_pattern", 6)
        return tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n))
    if kind in ("qwen2", "qwen3"):
        if not r.bool("use_sliding_window", False) or not window:
            return (FULL_ATTENTION,) * n
        first = r.int("max_window_layers", n, low=0)
        return tuple(SLIDING_ATTENTION if i >= first else FULL_ATTENTION for i in range(n))
    return (SLIDING_ATTENTION if window else FULL_ATTENTION,) * n


def model_config_from_hf(
    cfg: dict[str, Any], name: str = "", source: str | Path = "config.json"
) -> ModelConfig:
    """`source` names the file in errors."""
    r = ConfigReader(cfg, source)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise r.fail("architectures", "a list of class names", archs)
    arch = next((a for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"{source}: unsupported architecture {archs or cfg.get('model_type')!r}; "
            f"inferd supports: {', '.join(supported_architectures())}"
        )
    kind = ARCHITECTURES[arch]
    if cfg.get("mlp_bias") or (kind == "llama" and cfg.get("attention_bias")):
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
    rope_params = cfg.get("rope_parameters")
    theta, scaling = r.number("rope_theta", None), cfg.get("rope_scaling")
    extra: dict[str, Any] = {}
    if kind == "gemma3":
        per_type = (
            rope_params if isinstance(rope_params, dict) and FULL_ATTENTION in rope_params else {}
        )
        rope = _rope(r, per_type.get(FULL_ATTENTION), theta or 1_000_000.0, scaling,
                     f"rope_parameters.{FULL_ATTENTION}")  # fmt: skip
        rope_local = _rope(r, per_type.get(SLIDING_ATTENTION),
                           r.number("rope_local_base_freq", 10_000.0), None,
                           f"rope_parameters.{SLIDING_ATTENTION}")  # fmt: skip
        extra = dict(
            rope_local=rope_local,
            query_scale=r.number("query_pre_attn_scalar", 256.0) ** -0.5,
            embedding_multiplier=hidden**0.5,
            qk_norm=True,
            final_logit_softcapping=r.number("final_logit_softcapping", None),
            attn_logit_softcapping=r.number("attn_logit_softcapping", None),
        )
    else:
        rope = _rope(r, rope_params, theta, scaling, "rope_parameters")
        extra = dict(qk_norm=kind == "qwen3")
    layer_types = _layer_types(r, kind, n_layers)
    # 0 or null means no window: sliding layers then see every token
    window = r.int("sliding_window", None, low=0) if SLIDING_ATTENTION in layer_types else None
    dtype = r.str("dtype", None) or r.str("torch_dtype", None) or "float32"
    return ModelConfig(
        architecture=kind,
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=r.int("intermediate_size"),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", 1e-6),
        max_position_embeddings=r.int("max_position_embeddings", 4096),
        tie_word_embeddings=r.bool("tie_word_embeddings", kind == "gemma3"),
        hidden_act=r.str("hidden_activation", None) or r.str("hidden_act", None) or "silu",
        attention_bias=kind == "qwen2",  # Qwen2 always has q/k/v biases
        layer_types=layer_types,
        sliding_window=window or None,
        rope=rope,
        bos_token_id=r.token_id("bos_token_id"),
        eos_token_ids=_eos_ids(r),
        pad_token_id=r.token_id("pad_token_id"),
        checkpoint_dtype=dtype,
        name=name,
        **extra,
    )
