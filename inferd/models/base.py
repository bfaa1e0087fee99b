"""What every decoder-only model shares: embedding → layers → final norm → LM head, RoPE
tables computed once per step, and name-based weight loading with fused projections."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import SINGLE, TPGroup, kv_head_range
from inferd.errors import ModelLoadError
from inferd.layers.attention import SelfAttention
from inferd.layers.embedding import LMHead, VocabEmbedding
from inferd.layers.linear import Linear
from inferd.layers.norm import RMSNorm
from inferd.layers.rotary import RotaryEmbedding

# checkpoint sub-name → (our fused module, shard index)
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class DecoderBody(nn.Module):
    """HF's `model.*` submodule: named so checkpoint names map one to one."""

    def __init__(self, config: ModelConfig, layers: list[nn.Module], dtype: torch.dtype,
                 norm_offset: bool, tp: TPGroup):  # fmt: skip
        super().__init__()
        self.embed_tokens = VocabEmbedding(
            config.vocab_size, config.hidden_size, dtype, config.embedding_multiplier, tp
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, norm_offset, dtype)


class CausalLM(nn.Module):
    """Base of all architectures. Subclasses provide `make_layer` and `norm_offset`."""

    norm_offset = False  # Gemma's RMSNorm scales by (1 + w)

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        self.config, self.dtype, self.tp = config, dtype, tp
        layers = [self.make_layer(config, i, dtype, tp) for i in range(config.num_layers)]
        self.model = DecoderBody(config, layers, dtype, self.norm_offset, tp)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, dtype, tied, tp)
        # KV heads this rank caches (all of them without tensor parallelism).
        self.local_kv_heads = kv_head_range(config.num_kv_heads, tp)[1]
        # One RotaryEmbedding per distinct RoPE config; layers index into it.
        ropes = [config.layer_rope(i) for i in range(config.num_layers)]
        distinct = [r for i, r in enumerate(ropes) if r not in ropes[:i]]
        self.rotaries = [RotaryEmbedding(config.head_dim, r) for r in distinct]
        self.rope_index = [distinct.index(r) for r in ropes]

    def make_layer(self, config: ModelConfig, layer: int, dtype: torch.dtype,
                   tp: TPGroup) -> nn.Module:  # fmt: skip
        raise NotImplementedError

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Flattened new tokens of a step → final hidden states [num_tokens, hidden].

        NOTE: the residual stream is float32 whatever the weights' dtype: matmuls run in the
        model dtype, but the running sum of layer outputs is not rounded to bf16 after every
        layer (HF rounds it; inferd is more precise there, and skips converting it back to
        float32 in every norm). In float32 runs this is exactly HF's computation."""
        h = self.model.embed_tokens(input_ids).float()
        tables = [rot.cos_sin(positions, torch.float32) for rot in self.rotaries]
        for layer, rope in zip(self.model.layers, self.rope_index):
            h = layer(h, tables[rope], ctx)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden, self.config.final_logit_softcapping)

    # ---- weights -------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Fill the parameters from checkpoint weights (HF names; lazy: each `.load(dtype,
        rows=, cols=)` reads only what this rank keeps). Every parameter must be set."""
        modules = dict(self.named_modules())
        params = dict(self.named_parameters())
        pending = set(params)
        if self.config.tie_word_embeddings:
            pending.discard("lm_head.weight")
        for name, weight in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still store a copy
            module_name, _, leaf = name.rpartition(".")
            parent, _, sub = module_name.rpartition(".")
            fused, shard = STACKED_PARAMS.get(sub, (sub, 0))
            target = f"{parent}.{fused}" if parent else fused
            module = modules.get(target)
            try:
                if isinstance(module, Linear):
                    module.load_shard(leaf, weight, shard)
                elif isinstance(module, VocabEmbedding | LMHead) and leaf == "weight":
                    module.load(weight)
                elif name in params:
                    tensor = weight.load(params[name].dtype)
                    if params[name].shape != tensor.shape:
                        raise ValueError(f"shape {tuple(tensor.shape)}, the model expects "
                                         f"{tuple(params[name].shape)}")  # fmt: skip
                    params[name].copy_(tensor)
                else:
                    raise ValueError("it has no place in the model")
            except ValueError as e:
                raise ModelLoadError(f"checkpoint tensor {name!r}: {e}") from e
            pending.discard(f"{target}.{leaf}" if target in modules else name)
        if pending:
            missing = ", ".join(sorted(pending)[:5])
            raise ModelLoadError(f"checkpoint lacks {len(pending)} tensors, e.g. {missing}")
        self.finalize()

    def keep_gguf_blocks(self) -> None:
        """`--quantization gguf`: before loading, make every linear layer, the embedding and the
        LM head keep the checkpoint's block-quantised tensors as they are (see gguf_blocks)."""
        from inferd.cpu_kernels import kernel_library

        lib = kernel_library()
        for module in self.modules():
            if isinstance(module, Linear):
                module.block_parts = {}
            elif isinstance(module, VocabEmbedding | LMHead):
                module.keep_blocks = True
            elif isinstance(module, RMSNorm):
                module.use_kernel(lib)  # float32 out: the block kernel's input

    def finalize(self) -> None:
        """Derived tensors (norm gains) from the loaded weights."""
        for module in self.modules():
            if isinstance(module, Linear) and module.block_parts is not None:
                module.finalize_blocks()
        embedding = self.model.embed_tokens
        if self.config.tie_word_embeddings and embedding.blocks is not None:
            self.lm_head.small_step = embedding.blocks
            self.lm_head.weight = embedding.weight
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.finalize()
        for module in self.modules():
            if isinstance(module, SelfAttention):
                module.finalize()
