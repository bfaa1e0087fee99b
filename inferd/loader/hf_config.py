"""HF `config.json` → `ModelConfig`, for both the transformers 4 and 5 spellings of RoPE."""

from __future__ import annotations

from typing import Any

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeConfig
from inferd.errors import ModelLoadError
from inferd.models.registry import ARCHITECTURES, supported_architectures


def _rope(params: dict[str, Any] | None, theta: float | None, scaling: dict | None) -> RopeConfig:
    """transformers 5 writes `rope_parameters` {rope_type, rope_theta, ...}; 4 writes
    `rope_theta` plus an optional `rope_scaling` dict."""
    if params:
        theta = params.get("rope_theta", theta)
        kind = params.get("rope_type", params.get("type", "default"))
        scaling = (
            None if kind == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        )
    elif scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return RopeConfig(theta=float(theta if theta is not None else 10000.0), scaling=scaling)


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def _layer_types(cfg: dict, kind: str, n: int) -> tuple[str, ...]:
    if cfg.get("layer_types"):
        return tuple(cfg["layer_types"])
    window = cfg.get("sliding_window")
    if kind == "gemma3":
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n))
    if kind in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window") or window is None:
            return (FULL_ATTENTION,) * n
        first = int(cfg.get("max_window_layers", n))
        return tuple(SLIDING_ATTENTION if i >= first else FULL_ATTENTION for i in range(n))
    return (SLIDING_ATTENTION if window else FULL_ATTENTION,) * n


def model_config_from_hf(cfg: dict[str, Any], name: str = "") -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"unsupported architecture {archs or cfg.get('model_type')!r}; "
            f"inferd supports: {', '.join(supported_architectures())}"
        )
    kind = ARCHITECTURES[arch]
    if cfg.get("mlp_bias") or (kind == "llama" and cfg.get("attention_bias")):
        raise ModelLoadError("checkpoints with MLP or output-projection biases are not supported")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_layers = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rope_params = cfg.get("rope_parameters")
    theta, scaling = cfg.get("rope_theta"), cfg.get("rope_scaling")
    extra: dict[str, Any] = {}
    if kind == "gemma3":
        per_type = rope_params if rope_params and FULL_ATTENTION in rope_params else {}
        rope = _rope(per_type.get(FULL_ATTENTION), theta or 1_000_000.0, scaling)
        rope_local = _rope(
            per_type.get(SLIDING_ATTENTION), cfg.get("rope_local_base_freq", 10_000.0), None
        )
        extra = dict(
            rope_local=rope_local,
            query_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
            embedding_multiplier=hidden**0.5,
            qk_norm=True,
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        )
    else:
        rope = _rope(rope_params, theta, scaling)
        extra = dict(qk_norm=kind == "qwen3")
    layer_types = _layer_types(cfg, kind, n_layers)
    window = cfg.get("sliding_window") if SLIDING_ATTENTION in layer_types else None
    return ModelConfig(
        architecture=kind,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", kind == "gemma3")),
        hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
        attention_bias=kind == "qwen2",  # Qwen2 always has q/k/v biases
        layer_types=layer_types,
        sliding_window=int(window) if window else None,
        rope=rope,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"),
        checkpoint_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
        name=name,
        **extra,
    )
