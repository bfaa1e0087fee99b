"""A tiny HF model written as a GGUF file the way llama.cpp's converter writes it: tensor names
from gguf-py's own TensorNameMap (not inferd's tables), experts stacked [experts, rows, cols],
Llama-style q/k rows permuted, the metadata keys llama.cpp writes; float32 tensors (or Q8_0
matrices with `quantize`), so inferd reading the file can be compared with HF on the same
weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# inferd's tiny kinds → (GGUF architecture, llama.cpp permutes q/k rows for its RoPE)
GGUF_ARCH = {
    "llama": ("llama", True),
    "mistral": ("llama", True),
    "mixtral": ("llama", True),
    "phi3": ("phi3", False),
    "qwen2_moe": ("qwen2moe", False),
    "qwen3_moe": ("qwen3moe", False),
    "olmoe": ("olmoe", False),
    "gemma2": ("gemma2", False),
    "granite": ("granite", True),  # llama.cpp converts Granite as a Llama
    "olmo2": ("olmo2", False),
    "gpt_oss": ("gpt-oss", False),
}
# Families whose norm gains llama.cpp's converter stores as (1 + w), as their RMSNorm applies them
NORM_PLUS_ONE = {"gemma2"}


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute: each head's "rotate half" rows into interleaved pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _stacked_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert tensors (`...experts.E.w.weight`, as save_pretrained writes them) stacked into
    one [experts, rows, cols] tensor per layer and kind, named without the expert number."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in state.items():
        parts = name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            key = ".".join(parts[: i + 1] + parts[i + 2 : -1])
            groups.setdefault(key, {})[int(parts[i + 1])] = t
        else:
            out[name] = t
    for key, per_expert in groups.items():
        out[key + ".weight"] = torch.stack([per_expert[e] for e in sorted(per_expert)])
    return out


def write_gguf(model, kind: str, path: Path, quantize: bool = False, vocab: bool = False,
               experts_type=None) -> Path:  # fmt: skip
    """`vocab`: with a plain vocabulary of the model's size in the metadata, so that
    `LLM(model=path)` runs the file (token ids in, token ids out). `experts_type`: a
    GGMLQuantizationType for the stacked experts' matrices (gpt-oss's MXFP4)."""
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    arch, permuted = GGUF_ARCH[kind]
    cfg = model.config
    state = _stacked_experts({k: v.detach().float() for k, v in _checkpoint_state(model).items()})
    if kind == "gpt_oss":
        state = _gpt_oss_tensors(state)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(
            getattr(cfg, "moe_intermediate_size", cfg.intermediate_size)
        )
        if getattr(cfg, "shared_expert_intermediate_size", 0):
            writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    _family_metadata(writer, arch, cfg)
    if vocab:
        _plain_vocab(writer, cfg.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if arch == "gpt-oss":
        _gpt_oss_metadata(writer, cfg)
    names = gguf.TensorNameMap(gguf.MODEL_ARCH[arch.upper().replace("-", "_")],
                               cfg.num_hidden_layers)  # fmt: skip
    for name, t in state.items():
        base, _, leaf = name.rpartition(".")
        gguf_name = names.get_name(base)
        assert gguf_name is not None, f"gguf-py has no name for {name} in {arch}"
        if permuted and base.endswith("q_proj"):
            t = _permute(t, heads)
        elif permuted and base.endswith("k_proj"):
            t = _permute(t, kv_heads)
        if kind in NORM_PLUS_ONE and name.endswith("norm.weight"):
            t = t + 1
        if base.endswith("shared_expert_gate"):
            t = t.reshape(-1)  # llama.cpp declares ffn_gate_inp_shexp [n_embd]
        data = t.numpy().astype(np.float32)
        if experts_type is not None and ".experts." in base and leaf == "weight":
            writer.add_tensor(f"{gguf_name}.{leaf}", gguf.quants.quantize(data, experts_type),
                              raw_dtype=experts_type)  # fmt: skip
            continue
        whole_blocks = data.shape[-1] % 32 == 0  # Q8_0 rows are blocks of 32
        if quantize and data.ndim >= 2 and whole_blocks and "norm" not in base \
                and not base.endswith(".gate"):  # fmt: skip
            writer.add_tensor(f"{gguf_name}.{leaf}", gguf.quants.quantize(data, T.Q8_0),
                              raw_dtype=T.Q8_0)  # fmt: skip
        else:
            writer.add_tensor(f"{gguf_name}.{leaf}", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _family_metadata(writer, arch: str, cfg) -> None:
    """The keys llama.cpp's converter writes for one family only (none for olmo2)."""
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    elif arch == "granite":  # the *_multiplier config keys as *_scale, each only when set
        for add, value in ((writer.add_attention_scale, cfg.attention_multiplier),
                           (writer.add_embedding_scale, cfg.embedding_multiplier),
                           (writer.add_residual_scale, cfg.residual_multiplier),
                           (writer.add_logit_scale, cfg.logits_scaling)):  # fmt: skip
            if value:
                add(value)


def _plain_vocab(writer, size: int) -> None:
    """<unk>, <s>, </s>, <pad>, then pieces "▁t4" ... (SentencePiece style)."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "<pad>"]
                          + [f"\u2581t{i}" for i in range(4, size)])  # fmt: skip
    writer.add_token_scores([0.0] * 4 + [-float(i) for i in range(4, size)])
    writer.add_token_types([2, 3, 3, 3] + [1] * (size - 4))
    writer.add_unk_token_id(0)


def _checkpoint_state(model) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained writes (per-expert layout), read back from a saved copy."""
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, safe_serialization=True)
        state = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            state.update(load_file(str(file)))
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def _gpt_oss_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As llama.cpp's converter: the packed experts (stored input by output, gate and up
    interleaved along the outputs) as stacked gate, up and down matrices [experts, out, in] and
    their biases; the sinks named as a weight."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        prefix = name.rpartition(".")[0] + "."
        if name.endswith(".experts.gate_up_proj"):
            t = t.transpose(-1, -2)
            out[prefix + "gate_proj.weight"], out[prefix + "up_proj.weight"] = t[:, ::2], t[:, 1::2]
        elif name.endswith(".experts.gate_up_proj_bias"):
            out[prefix + "gate_proj.bias"], out[prefix + "up_proj.bias"] = t[:, ::2], t[:, 1::2]
        elif name.endswith(".experts.down_proj"):
            out[prefix + "down_proj.weight"] = t.transpose(-1, -2)
        elif name.endswith(".experts.down_proj_bias"):
            out[prefix + "down_proj.bias"] = t
        elif name.endswith(".self_attn.sinks"):
            out[name + ".weight"] = t
        else:
            out[name] = t
    return {name: t.contiguous() for name, t in out.items()}


def _gpt_oss_metadata(writer, cfg) -> None:
    """What llama.cpp's converter adds for gpt-oss: YaRN (it keeps no `truncate`: gpt-oss's own
    is false)."""
    import gguf

    rope = cfg.rope_parameters
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
