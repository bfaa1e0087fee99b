"""What every decoder-only model shares: embedding → layers → final norm → LM head, RoPE
tables computed once per step, and name-based weight loading with fused projections.

A model is built for one `WeightScheme` (inferd/layers/weight_scheme.py), which every layer
asks for its weight format and kernels at construction. With a block scheme and inferd's C
kernels, the model also owns a `CpuDecoder` (cpu_decoder.py) that runs the decoder layers of
every step in C (the cpu attention backend's fixed-order mode, float32 or bf16 KV caches); other
steps take the layers' own forward.
"""

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
from inferd.layers.moe import ExpertLinear, SparseMoE
from inferd.layers.norm import RMSNorm, scheme_norm
from inferd.layers.rotary import RotaryEmbedding, kernel_cos_sin
from inferd.layers.weight_scheme import WeightScheme, as_scheme
from inferd.models.cpu_decoder import CpuDecoder

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

    def __init__(self, config: ModelConfig, layers: list[nn.Module], scheme: WeightScheme,
                 norm_offset: bool, tp: TPGroup):  # fmt: skip
        super().__init__()
        self.embed_tokens = VocabEmbedding(
            config.vocab_size, config.hidden_size, scheme, config.embedding_multiplier, tp
        )
        self.layers = nn.ModuleList(layers)
        self.norm = scheme_norm(scheme, config.hidden_size, config.rms_norm_eps, norm_offset)


class CausalLM(nn.Module):
    """Base of all architectures. Subclasses provide `make_layer` and `norm_offset`; their
    decoder layers provide `parts()` (a DecoderLayerParts, decoder_layer_parts.py)."""

    norm_offset = False  # Gemma's RMSNorm scales by (1 + w)

    def __init__(self, config: ModelConfig, scheme: WeightScheme | torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE):  # fmt: skip
        """`scheme`: how the weights are held (a dtype: dense weights in it)."""
        super().__init__()
        scheme = as_scheme(scheme)
        self.config, self.scheme, self.dtype, self.tp = config, scheme, scheme.dtype, tp
        layers = [self.make_layer(config, i, scheme, tp) for i in range(config.num_layers)]
        self.model = DecoderBody(config, layers, scheme, self.norm_offset, tp)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, scheme, tied, tp)
        self.cpu_decoder = None  # a CpuDecoder, built in `finalize` when the scheme allows
        # KV heads this rank caches (all of them without tensor parallelism).
        self.local_kv_heads = kv_head_range(config.num_kv_heads, tp)[1]
        # One RotaryEmbedding per distinct RoPE config; layers index into it.
        ropes = [config.layer_rope(i) for i in range(config.num_layers)]
        distinct = [r for i, r in enumerate(ropes) if r not in ropes[:i]]
        self.rotaries = [RotaryEmbedding(config.head_dim, r) for r in distinct]
        self.rope_index = [distinct.index(r) for r in ropes]

    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme,
                   tp: TPGroup) -> nn.Module:  # fmt: skip
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Flattened new tokens of a step → final hidden states [num_tokens, hidden].
        `embeds` (index, rows): input embeddings that replace the token embeddings at those
        indices of the step's tokens (a vision-language model's image features at the image's
        placeholder tokens; engine/execution/runner.py gathers them).

        NOTE: the residual stream is float32 whatever the weights' dtype: matmuls run in the
        model dtype, but the running sum of layer outputs is not rounded to bf16 after every
        layer (HF rounds it; inferd is more precise there, and skips converting it back to
        float32 in every norm). In float32 runs this is exactly HF's computation."""
        h = self.model.embed_tokens(input_ids).float()
        if embeds is not None:
            h = h.index_copy(0, embeds[0], embeds[1].to(h.dtype))
        if self.cpu_decoder is not None and self.cpu_decoder.serves(ctx):
            h = self.cpu_decoder.run(h, positions, ctx)  # every step, whatever its rows
        else:
            tables = [self._cos_sin(rot, positions) for rot in self.rotaries]
            for layer, i in zip(self.model.layers, self.rope_index):
                h = layer(h, tables[i], ctx)
        return self.model.norm(h)

    def _cos_sin(self, rotary: RotaryEmbedding, positions: torch.Tensor):
        """The step's RoPE tables; by the C kernel where the scheme has one (GGUF blocks,
        --deterministic: the same bits for a position whatever the step), else PyTorch's (HF's
        bits: the parity tests)."""
        if self.scheme.kernels is not None and positions.device.type == "cpu":
            cos, sin = kernel_cos_sin(self.scheme.kernels, rotary.portable_inv_freq, positions,
                                      rotary.magnitude)  # fmt: skip
            return cos[:, None, :], sin[:, None, :]
        return rotary.cos_sin(positions, torch.float32)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden, self.config.final_logit_softcapping)
        if self.config.logits_scaling != 1.0:  # Granite
            logits = logits / self.config.logits_scaling
        return logits

    # ---- weights -------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, object]],
                     preloaded: frozenset[str] = frozenset()) -> None:  # fmt: skip
        """Fill the parameters from checkpoint weights (HF names, as loader/tensor_layout.py
        normalises them; lazy: each `.load(dtype, rows=, cols=)` reads only what this rank
        keeps). Every parameter must be set, except `preloaded` ones (module.weight names whose
        blocks came from the block cache). Modules with a `load_checkpoint_tensor` (the experts
        of a Mixture of Experts) take the names under them and say what they still miss."""
        modules = dict(self.named_modules())
        params = dict(self.named_parameters())
        owners = {n: m for n, m in modules.items() if hasattr(m, "load_checkpoint_tensor")}
        pending = {p for p in params if not p.startswith(tuple(f"{o}." for o in owners))}
        pending -= preloaded
        if self.config.tie_word_embeddings:
            pending.discard("lm_head.weight")
        for name, weight in weights:
            if name.endswith("rotary_emb.inv_freq") or self.skips_tensor(name):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still store a copy
            module_name, _, leaf = name.rpartition(".")
            parent, _, sub = module_name.rpartition(".")
            fused, shard = STACKED_PARAMS.get(sub, (sub, 0))
            target = f"{parent}.{fused}" if parent else fused
            if f"{target}.{leaf}" in preloaded:
                continue
            module = modules.get(target)
            owner = _owner(owners, name)
            try:
                if owner is not None:
                    owners[owner].load_checkpoint_tensor(name[len(owner) + 1 :], weight)
                    continue
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
        pending |= {f"{o}.{rest}" for o, m in owners.items() for rest in m.missing_tensors()}
        if pending:
            missing = ", ".join(sorted(pending)[:5])
            raise ModelLoadError(f"checkpoint lacks {len(pending)} tensors, e.g. {missing}")
        self.finalize()

    def skips_tensor(self, name: str) -> bool:
        """Whether the checkpoint tensor `name` is one the model does not use (a vision
        tower's layers after the one its features come from)."""
        return False

    def finalize(self) -> None:
        """After loading: each layer's method converts its weights to its format (blocks
        stacked, weights quantised), then the tensors derived from them (norm gains), then the
        C decoder where the scheme allows it and the family's layers are ones it computes."""
        for module in self.modules():
            if isinstance(module, Linear | VocabEmbedding | ExpertLinear):
                module.finish_loading()
        self.lm_head.finish_loading(self.model.embed_tokens)
        for module in self.modules():
            if isinstance(module, RMSNorm | SelfAttention):
                module.finalize()
        if (
            self.scheme.blocks
            and self.scheme.kernels is not None
            and not self.tp.enabled
            and self.c_decoder_computes_layers()
        ):
            self.cpu_decoder = CpuDecoder.for_model(self)

    def c_decoder_computes_layers(self) -> bool:
        """Whether the family's record says the C decoder layer computes it, and no layer's MLP
        is a Mixture of Experts (the C layer has a dense gated MLP only)."""
        from inferd.models.registry import architecture

        dense = not any(isinstance(m, SparseMoE) for m in self.modules())
        return dense and architecture(self.config.architecture).c_decoder


def _owner(owners: dict[str, nn.Module], name: str) -> str | None:
    """The module among `owners` whose name prefixes `name`, if any."""
    if not owners:
        return None
    prefix = name
    while "." in prefix:
        prefix = prefix.rpartition(".")[0]
        if prefix in owners:
            return prefix
    return None
