"""A GGUF file as a checkpoint: `ModelConfig` from its metadata, and its tensors renamed to HF
names and converted to the conventions inferd's models (and HF transformers) use.

The metadata every family shares is read here; the family's own (Gemma's sliding pattern, the
experts of a Mixture of Experts) by its Architecture record's `gguf_fields` (inferd/models/),
through a `GGUFReader`. The record also names the file's per-layer tensors and says which of
llama.cpp's value conventions to undo."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, MoEConfig, RopeConfig
from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import GGUFFile
from inferd.loader.gguf_quants import BLOCK_LAYOUT, dequantize, is_block_quantized, unpack
from inferd.models.architecture import Architecture
from inferd.models.registry import architecture, for_gguf, supported_gguf_architectures

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_REQUIRED = object()


class GGUFReader:
    """Typed reads of a GGUF file's metadata for an Architecture record's `gguf_fields`
    (values were type-checked when the file was opened, gguf_metadata.py)."""

    def __init__(self, gguf: GGUFFile):
        self.gguf, self.arch, self.path = gguf, gguf.architecture, gguf.path

    def meta(self, key: str, default: Any = _REQUIRED) -> Any:
        """`{architecture}.{key}`; a missing required key is a ModelLoadError naming it."""
        value = self.gguf.get(f"{self.arch}.{key}")
        if value is None:
            if default is _REQUIRED:
                raise ModelLoadError(f"{self.path}: GGUF metadata lacks {self.arch}.{key}")
            return default
        return value

    def has_tensor(self, name: str) -> bool:
        return name in self.gguf.tensors

    def yarn(self) -> dict[str, Any]:
        """YaRN as llama.cpp's converter stores it, in HF's rope_scaling keys (a family's
        record adds what the file does not say, e.g. gpt-oss's `truncate`)."""
        out = {"rope_type": "yarn", "factor": float(self.meta("rope.scaling.factor")),
               "original_max_position_embeddings": int(
                   self.meta("rope.scaling.original_context_length"))}  # fmt: skip
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if self.meta(f"rope.scaling.{key}", None) is not None:
                out[name] = float(self.meta(f"rope.scaling.{key}"))
        return out

    @property
    def num_layers(self) -> int:
        return int(self.meta("block_count"))

    def experts(self, normalize_top_k: bool) -> MoEConfig:
        """The experts as llama.cpp's converter describes them; `normalize_top_k` is the
        family's rule when the file does not say (`expert_weights_norm`)."""
        n = self.num_layers
        shared = int(self.meta("expert_shared_feed_forward_length", 0))
        if not shared and self.has_tensor("blk.0.ffn_up_shexp.weight"):
            shared = self.gguf.tensors["blk.0.ffn_up_shexp.weight"].shape[0]
        return MoEConfig(
            num_experts=int(self.meta("expert_count")),
            top_k=int(self.meta("expert_used_count")),
            intermediate_size=int(
                self.meta("expert_feed_forward_length", self.meta("feed_forward_length"))
            ),
            normalize_top_k=bool(self.meta("expert_weights_norm", normalize_top_k)),
            shared_intermediate_size=shared,
            shared_gate=self.has_tensor("blk.0.ffn_gate_inp_shexp.weight"),
            dense_layers=tuple(
                i for i in range(n) if not self.has_tensor(f"blk.{i}.ffn_gate_inp.weight")
            ),
        )


def gguf_architecture(gguf: GGUFFile) -> Architecture:
    moe = any(name.endswith(".ffn_gate_inp.weight") for name in gguf.tensors)
    record = for_gguf(gguf.architecture, moe)
    if record is None:
        kind = " with experts" * moe
        raise ModelLoadError(
            f"{gguf.path}: unsupported GGUF architecture {gguf.architecture!r}{kind}; "
            f"inferd supports: {', '.join(supported_gguf_architectures())}"
        )
    return record


def model_config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    record = gguf_architecture(gguf)
    g = GGUFReader(gguf)
    meta = g.meta
    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    n_layers = g.num_layers
    head_dim = int(meta("attention.key_length", hidden // heads))
    embd = gguf.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelLoadError(f"{gguf.path}: no token_embd.weight tensor")
    scaling = None
    if meta("rope.scaling.type", None) == "linear":
        scaling = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))}
    elif meta("rope.scaling.type", None) == "yarn":
        scaling = g.yarn()
    elif meta("rope.scaling.type", None) not in (None, "none"):
        raise ModelLoadError(f"{gguf.path}: unsupported RoPE scaling {meta('rope.scaling.type')!r}")
    if "rope_freqs.weight" in gguf.tensors:
        factors = load_tensor(gguf, "rope_freqs.weight", torch.float32).tolist()
        scaling = {"rope_type": "freq_factors", "factors": factors}
    eos = gguf.get("tokenizer.ggml.eos_token_id")
    window = meta("attention.sliding_window", None)
    fields: dict[str, Any] = dict(
        vocab_size=embd.shape[0],
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
        layer_types=(SLIDING_ATTENTION if window else FULL_ATTENTION,) * n_layers,
        sliding_window=int(window) if window else None,
        rope=RopeConfig(theta=float(meta("rope.freq_base", 10000.0)), scaling=scaling),
        bos_token_id=gguf.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        pad_token_id=gguf.get("tokenizer.ggml.padding_token_id"),
        checkpoint_dtype="gguf",
        name=str(gguf.get("general.name", gguf.path.stem)),
    )
    try:
        fields.update(record.gguf_fields(g))
        return ModelConfig(architecture=record.name, **fields)
    except ValueError as e:  # the configs' own consistency checks (e.g. experts per token)
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"{gguf.path}: {e}") from e


def hf_name(gguf_name: str, record: Architecture) -> str | None:
    """HF parameter name of a GGUF tensor, or None for tensors the model does not hold."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] != "blk" or len(parts) != 4:
        return None
    sub = record.gguf_tensors.get(parts[2])
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
    """One tensor of a GGUF file, read (and dequantised) only as far as a rank needs it. With
    `expert`, one matrix of a stacked 3-D tensor [experts, rows, cols] (`ffn_*_exps`)."""

    def __init__(self, gguf: GGUFFile, name: str, target: str, config: ModelConfig,
                 record: Architecture, expert: int | None = None):  # fmt: skip
        self.gguf, self.name, self.target, self.config = gguf, name, target, config
        self.record, self.expert_index = record, expert
        self.info = gguf.tensors[name]
        self.shape = self.info.shape if expert is None else self.info.shape[1:]

    def expert(self, index: int) -> GGUFWeight:
        return GGUFWeight(self.gguf, self.name, self.target, self.config, self.record, index)

    def _bytes(self):
        raw = self.gguf.raw(self.name)
        if self.expert_index is None:
            return raw
        # NOTE: experts are the outermost dimension, so each one's rows are contiguous bytes.
        per = raw.size // self.info.shape[0]
        return raw[self.expert_index * per : (self.expert_index + 1) * per]

    def _raw(self, rows: tuple[int, int] | None, cols: tuple[int, int] | None):
        """Bytes of the requested rows/columns, and the shape they dequantise to, when the
        slice falls on whole quantisation blocks; else None (dequantise all, then slice)."""
        info, raw = self.info, self._bytes()
        block, block_bytes = BLOCK_LAYOUT[info.ggml_type]
        shape = list(self.shape)
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

    def _permuted(self, target_endings: tuple[str, ...]) -> bool:
        return self.record.gguf_qk_permuted and self.target.endswith(target_endings)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        try:
            return self._load(dtype, rows, cols)
        finally:
            self.gguf.release_tensor(self.name)  # NOTE: what was read was copied

    def _load(self, dtype: torch.dtype, rows, cols) -> torch.Tensor:
        sliced = self._raw(rows, cols)
        if sliced is None:
            w = dequantize(self._bytes(), self.info.ggml_type, self.shape, torch.float32)
            if rows is not None:
                w = w[rows[0] : rows[0] + rows[1]]
            if cols is not None:
                w = w[:, cols[0] : cols[0] + cols[1]]
        else:
            # Dequantise in float32 and convert once: the same values HF transformers loads.
            w = dequantize(sliced[0], self.info.ggml_type, sliced[1], torch.float32)
        if self.record.gguf_norm_offset and self.target.endswith("norm.weight"):
            w = w - self.record.gguf_norm_offset  # e.g. Gemma's (1 + w); models add it back
        if self._permuted(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            w = _unpermute_rope(w, self.config.head_dim)
        return w.to(dtype)

    def load_blocks(self, rows=None, cols=None):
        """The requested part as BlockValues (q, scale, offset: see gguf_quants.unpack),
        or None when the tensor is not block-quantised or the slice cuts through blocks."""
        try:
            return self._load_blocks(rows, cols)
        finally:
            self.gguf.release_tensor(self.name)  # NOTE: unpacking copies what it reads

    def _load_blocks(self, rows, cols):
        info = self.info
        if not is_block_quantized(info.ggml_type) or len(self.shape) != 2:
            return None
        sliced = self._raw(rows, cols)
        if sliced is None:
            return None
        values = unpack(sliced[0], info.ggml_type, sliced[1])
        if self._permuted(("q_proj.weight", "k_proj.weight")):
            head_dim = self.config.head_dim

            def rows_unpermuted(t):
                return None if t is None else _unpermute_rope(t, head_dim)

            def parts_unpermuted(parts):
                return None if parts is None else tuple(map(rows_unpermuted, parts))

            v = values
            values = v._replace(q=rows_unpermuted(v.q), scale=rows_unpermuted(v.scale),
                                offset=rows_unpermuted(v.offset),
                                scale_parts=parts_unpermuted(v.scale_parts),
                                offset_parts=parts_unpermuted(v.offset_parts))  # fmt: skip
        return values


def gguf_weights(gguf: GGUFFile, config: ModelConfig) -> Iterator[tuple[str, GGUFWeight]]:
    """The file's tensors under their HF names (stacked experts still stacked: the loader's
    tensor_layout.py splits them)."""
    record = architecture(config.architecture)
    for name in gguf.tensors:
        target = hf_name(name, record)
        if target is not None:
            yield target, GGUFWeight(gguf, name, target, config, record)


def gguf_parameter_bytes(gguf: GGUFFile) -> int:
    return sum(info.n_bytes for info in gguf.tensors.values())


def gguf_parameter_count(gguf: GGUFFile) -> int:
    return sum(
        math.prod(info.shape) for info in gguf.tensors.values() if info.name != "rope_freqs.weight"
    )
