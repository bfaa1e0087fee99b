"""A GGUF file as a checkpoint: `ModelConfig` from its metadata, and its tensors renamed to HF
names and converted to the conventions inferd's models (and HF transformers) use."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeConfig
from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import GGUFFile
from inferd.loader.gguf_quants import BLOCK_LAYOUT, dequantize, is_block_quantized, unpack
from inferd.models.registry import GGUF_ARCHITECTURES

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Gemma 3 facts llama.cpp's converter does not store (see DESIGN.md): HF's defaults.
_GEMMA3_LOCAL_ROPE_BASE = 10_000.0
_GEMMA3_SLIDING_PATTERN = 6
_GEMMA3_QUERY_PRE_ATTN_SCALAR = 256


def gguf_kind(gguf: GGUFFile) -> str:
    arch = gguf.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{gguf.path}: unsupported GGUF architecture {arch!r}; "
            f"inferd supports: {', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    return GGUF_ARCHITECTURES[arch]


def model_config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    kind = gguf_kind(gguf)
    arch = gguf.architecture

    def meta(key: str, default=None):
        value = gguf.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{gguf.path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    n_layers = int(meta("block_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    embd = gguf.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelLoadError(f"{gguf.path}: no token_embd.weight tensor")
    vocab = embd.shape[0]
    scaling = None
    if gguf.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))}
    elif gguf.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelLoadError(
            f"{gguf.path}: unsupported RoPE scaling {gguf.get(f'{arch}.rope.scaling.type')!r}"
        )
    if "rope_freqs.weight" in gguf.tensors:
        factors = load_tensor(gguf, "rope_freqs.weight", torch.float32).tolist()
        scaling = {"rope_type": "freq_factors", "factors": factors}
    rope = RopeConfig(theta=float(meta("rope.freq_base", 10000.0)), scaling=scaling)
    eos = gguf.get("tokenizer.ggml.eos_token_id")
    common = dict(
        architecture=kind,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(meta("context_length", 4096)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gguf.tensors,
        rope=rope,
        bos_token_id=gguf.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        pad_token_id=gguf.get("tokenizer.ggml.padding_token_id"),
        checkpoint_dtype="gguf",
        name=str(gguf.get("general.name", gguf.path.stem)),
    )
    if kind == "gemma3":
        window = int(meta("attention.sliding_window"))
        layer_types = tuple(
            SLIDING_ATTENTION if (i + 1) % _GEMMA3_SLIDING_PATTERN else FULL_ATTENTION
            for i in range(n_layers)
        )
        return ModelConfig(
            **common,
            hidden_act="gelu_pytorch_tanh",
            layer_types=layer_types,
            sliding_window=window,
            rope_local=RopeConfig(theta=_GEMMA3_LOCAL_ROPE_BASE),
            query_scale=_GEMMA3_QUERY_PRE_ATTN_SCALAR**-0.5,
            embedding_multiplier=hidden**0.5,
        )
    window = gguf.get(f"{arch}.attention.sliding_window")
    return ModelConfig(
        **common,
        layer_types=(SLIDING_ATTENTION if window else FULL_ATTENTION,) * n_layers,
        sliding_window=int(window) if window else None,
    )


def hf_name(gguf_name: str, kind: str) -> str | None:
    """HF parameter name of a GGUF tensor, or None for tensors the model does not hold."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] != "blk" or len(parts) != 4:
        return None
    names = _GEMMA3_LAYER_NAMES if kind == "gemma3" else _LAYER_NAMES
    sub = names.get(parts[2])
    if sub is None:
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} is not understood by inferd")
    return f"model.layers.{parts[1]}.{sub}.{parts[3]}"


def load_tensor(gguf: GGUFFile, name: str, dtype: torch.dtype) -> torch.Tensor:
    info = gguf.tensors[name]
    return dequantize(gguf.raw(name), info.ggml_type, info.shape, dtype)


def _unpermute_rope(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """llama.cpp's converter reorders Llama's q/k rows so each head's rotary pairs interleave;
    undo it to get HF's "rotate half" layout (within each head, so a slice of whole heads can
    be undone on its own)."""
    n_heads = w.shape[0] // head_dim
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFWeight:
    """One tensor of a GGUF file, read (and dequantised) only as far as a rank needs it."""

    def __init__(self, gguf: GGUFFile, name: str, target: str, config: ModelConfig):
        self.gguf, self.name, self.target, self.config = gguf, name, target, config
        self.info = gguf.tensors[name]
        self.shape = self.info.shape

    def _raw(self, rows: tuple[int, int] | None, cols: tuple[int, int] | None):
        """Bytes of the requested rows/columns, and the shape they dequantise to, when the
        slice falls on whole quantisation blocks; else None (dequantise all, then slice)."""
        info, raw = self.info, self.gguf.raw(self.name)
        block, block_bytes = BLOCK_LAYOUT[info.ggml_type]
        shape = list(info.shape)
        if len(shape) == 1:
            if rows is None:
                return raw, tuple(shape)
            if rows[0] % block or rows[1] % block:
                return None
            start = rows[0] // block * block_bytes
            return raw[start : start + rows[1] // block * block_bytes], (rows[1],)
        row_bytes = raw.size // shape[0]
        if rows is not None:
            raw = raw[rows[0] * row_bytes : (rows[0] + rows[1]) * row_bytes]
            shape[0] = rows[1]
        if cols is not None:
            if cols[0] % block or cols[1] % block:
                return None
            first, count = cols[0] // block * block_bytes, cols[1] // block * block_bytes
            raw = raw.reshape(shape[0], row_bytes)[:, first : first + count].reshape(-1)
            shape[1] = cols[1]
        return raw, tuple(shape)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        sliced = self._raw(rows, cols)
        if sliced is None:
            w = load_tensor(self.gguf, self.name, torch.float32)
            if rows is not None:
                w = w[rows[0] : rows[0] + rows[1]]
            if cols is not None:
                w = w[:, cols[0] : cols[0] + cols[1]]
        else:
            # Dequantise in float32 and convert once: the same values HF transformers loads.
            w = dequantize(sliced[0], self.info.ggml_type, sliced[1], torch.float32)
        kind, target = self.config.architecture, self.target
        if kind == "gemma3" and target.endswith("norm.weight"):
            w = w - 1  # llama.cpp stores Gemma's (1 + w) norm gains; models add the 1 back
        if kind == "llama" and target.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight",
                                                "k_proj.bias")):  # fmt: skip
            w = _unpermute_rope(w, self.config.head_dim)
        return w.to(dtype)

    def load_blocks(self, rows=None, cols=None):
        """The requested part as (q, scale, offset) block quantisation (see gguf_quants.unpack),
        or None when the tensor is not block-quantised or the slice cuts through blocks."""
        info = self.info
        if not is_block_quantized(info.ggml_type) or len(info.shape) != 2:
            return None
        sliced = self._raw(rows, cols)
        if sliced is None:
            return None
        parts = unpack(sliced[0], info.ggml_type, sliced[1])
        if self.config.architecture == "llama" and self.target.endswith(
            ("q_proj.weight", "k_proj.weight")
        ):
            parts = tuple(p if p is None else _unpermute_rope(p, self.config.head_dim)
                          for p in parts)  # fmt: skip
        return parts


def gguf_weights(gguf: GGUFFile, config: ModelConfig) -> Iterator[tuple[str, GGUFWeight]]:
    for name in gguf.tensors:
        target = hf_name(name, config.architecture)
        if target is not None:
            yield target, GGUFWeight(gguf, name, target, config)


def gguf_parameter_bytes(gguf: GGUFFile) -> int:
    return sum(info.n_bytes for info in gguf.tensors.values())


def gguf_parameter_count(gguf: GGUFFile) -> int:
    return sum(
        math.prod(info.shape) for info in gguf.tensors.values() if info.name != "rope_freqs.weight"
    )
