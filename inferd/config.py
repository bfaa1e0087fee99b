"""Frozen configuration objects: what a model is, and how the engine runs it.

`ModelConfig` is architecture-neutral: the loaders translate an HF `config.json` or GGUF metadata
into it, and every other part of inferd (models, KV cache, memory accounting) reads only this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one kind of layer. `scaling` holds HF's rope_scaling dict (or None)."""

    theta: float = 10000.0
    scaling: dict[str, Any] | None = None


@dataclass(frozen=True)
class MoEConfig:
    """A Mixture-of-Experts MLP: per token a router scores `num_experts` gated MLPs (the
    experts) and the output is the weighted sum of the `top_k` best (layers/moe.py)."""

    num_experts: int
    top_k: int  # experts each token uses
    intermediate_size: int  # of each expert
    normalize_top_k: bool  # the chosen experts' router weights rescaled to sum to 1
    shared_intermediate_size: int = 0  # an expert every token uses (Qwen2-MoE); 0: none
    shared_gate: bool = False  # the shared expert's output scaled by sigmoid(x . w)
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is the model's dense one instead
    # gpt-oss: the router and every expert's gate/up and down carry biases; the softmax runs
    # over the chosen experts' logits only; the experts' activation is the clamped SwiGLU
    # (layers/activation.py `clamped_swiglu`) with these constants
    biases: bool = False
    softmax_after_top_k: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"experts per token ({self.top_k}) must be from 1 to the number of experts "
                f"({self.num_experts})"
            )


@dataclass(frozen=True)
class VisionConfig:
    """A vision-language model's image side (inferd/models/vision_encoder.py and the family's
    projector): a ViT encoder over square images cut into patches, whose features a projector
    turns into `tokens_per_image` rows of the text model's embedding width. Each row replaces
    one `image_token_id` placeholder of the prompt."""

    kind: str  # "clip" (a class token, a norm before the layers) or "siglip"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # pixels per side the encoder takes
    patch_size: int
    image_token_id: int  # the prompt's placeholder token, one per projected feature row
    tokens_per_image: int  # placeholders (and projected rows) per image
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"
    # Which encoder output feeds the projector: hidden state `feature_layer` (HF's index into
    # `hidden_states`: 0 the embeddings, -1 the last layer's output); "default" drops the class
    # token, "full" keeps it.
    feature_layer: int = -1
    feature_select: str = "full"
    post_norm: bool = False  # the encoder's final norm applies to the features (SigLIP's)
    projector: str = "llava"  # "llava": linear, act, linear; "gemma3": avg-pool, norm, matrix
    projector_act: str = "gelu"
    projector_bias: bool = True

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # the Architecture record's name (inferd/models/registry.py): "llama", ...
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    output_bias: bool = False  # gpt-oss: a bias on o_proj too
    qk_norm: bool = False  # Qwen3 / Gemma 3: RMSNorm over each head of q and k
    # One entry per layer: FULL_ATTENTION or SLIDING_ATTENTION.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None  # tokens a sliding layer sees, itself included
    rope: RopeConfig = field(default_factory=RopeConfig)  # full-attention layers
    rope_local: RopeConfig | None = None  # sliding layers, when they differ (Gemma 3)
    query_scale: float | None = None  # None: 1/sqrt(head_dim)
    embedding_multiplier: float = 1.0  # Gemma scales embeddings by sqrt(hidden)
    # Granite: every attention and MLP output scaled before it joins the residual stream, and
    # the logits divided by `logits_scaling`
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    checkpoint_dtype: str = "float32"  # the precision the checkpoint was published in
    name: str = ""
    moe: MoEConfig | None = None  # Mixture-of-Experts MLPs (None: every MLP is dense)
    vision: VisionConfig | None = None  # a vision-language model's image encoder (else None)

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )

    @property
    def scale(self) -> float:
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None for full attention."""
        if self.layer_types[layer] == SLIDING_ATTENTION:
            return self.sliding_window
        return None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a Mixture of Experts (else the dense gated MLP)."""
        return self.moe is not None and layer not in self.moe.dense_layers

    def layer_rope(self, layer: int) -> RopeConfig:
        if self.layer_types[layer] == SLIDING_ATTENTION and self.rope_local is not None:
            return self.rope_local
        return self.rope

    def kv_groups(self) -> list[tuple[int | None, list[int]]]:
        """Layers grouped by attention window: each group gets its own KV block pool, so
        sliding layers can drop blocks that left their window. Full attention comes first."""
        windows = sorted(
            {self.layer_window(i) for i in range(self.num_layers)},
            key=lambda w: (w is not None, w or 0),
        )
        return [
            (w, [i for i in range(self.num_layers) if self.layer_window(i) == w]) for w in windows
        ]

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)


GiB = 1 << 30
# Engine limits left unset, per device type. CPU: a step of 1024 tokens takes ~1 s on 2 cores,
# which bounds how long running decodes stall behind a prefill chunk.
ENGINE_DEFAULTS = {
    "cpu": dict(max_num_seqs=64, max_num_batched_tokens=1024, kv_cache_memory=2 * GiB),
    "cuda": dict(max_num_seqs=256, max_num_batched_tokens=8192),
}


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model. `None` fields get device-dependent defaults at start-up."""

    model: str | None = None  # None = the embedded default model
    # auto: with quantization None, the fastest accurate mode for the machine and checkpoint
    # (inferd/layers/weight_scheme.py); a dtype or a quantization forces a mode.
    dtype: str = "auto"
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None = CUDA when available
    max_model_len: int | None = None  # None = the model's own limit
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory: int | None = None  # bytes for the KV pool
    # bytes of packed GGUF blocks the weight cache keeps on disk (loader/weight_cache.py);
    # None: INFERD_WEIGHT_CACHE_SIZE, else 32 GiB; 0: nothing written
    weight_cache_size: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    enable_prefix_caching: bool = True
    seed: int = 0
    max_n: int = 128  # largest SamplingParams.n accepted
    max_stop_strings: int = 16
    max_stop_string_length: int = 512  # characters
    max_logprobs: int = 20  # largest logprobs / prompt_logprobs (vLLM's --max-logprobs)
    limit_mm_per_prompt: int = 4  # most images in one prompt (vision-language models)
    # A streaming request's output after its first token, then every this many tokens, and
    # when it ends (vLLM's --stream-interval): fewer events, less CPU per token in the front end.
    stream_interval: int = 1
    # The waiting queue's order (vLLM's --scheduling-policy): "fcfs", or "priority" (a request's
    # `priority`, lower first, preempting lower priorities: engine/scheduling/waiting_queue.py).
    scheduling_policy: str = "fcfs"
    # Seconds a request may wait from its arrival without being scheduled; then it ends with
    # "queue_timeout" (the server's 503 with Retry-After). None: it waits as long as it takes.
    max_queue_time: float | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    num_threads: int | None = None  # CPU intra-op threads; None = torch's default
    # "torch", "cpu", "triton"; auto = triton on CUDA when installed, cpu on CPU when inferd's C
    # kernels build, else torch
    attention_backend: str = "auto"
    enforce_eager: bool = False  # no CUDA graphs
    tensor_parallel_size: int = 1
    distributed_timeout: float | None = None  # seconds a collective may wait (None: 60)
    # Speculative decoding by n-gram prompt lookup: vLLM's --speculative-config, as a JSON
    # string, a dict or an inferd.spec_decode.SpeculativeConfig; None = off. The engine parses
    # it (inferd/spec_decode/config.py) before it loads anything.
    speculative_config: Any = None
    # Embeddings: overrides of what the model's files say about them (vLLM's --pooler-config; a
    # JSON string or a dict of pooling_type, normalize, is_matryoshka, matryoshka_dimensions:
    # inferd/pooling_params.py `pooler_overrides`); None = the model's own.
    pooler_config: Any = None
    # Each row's result independent of the rest of its step for the dense modes too (CPU; the
    # default on GGUF blocks is so already): inferd/layers/row_tiles.py, docs/performance.md.
    deterministic: bool = False
    # LoRA adapters (vLLM's names): served when enable_lora; max_loras resident in slots at
    # once (a request for another waits for a free slot), each of rank <= max_lora_rank;
    # max_cpu_loras parsed adapters kept in memory (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # KV tiers behind the pool (engine/kv_tiers/): bytes of a RAM tier shared by the replicas of
    # one server, and a disk tier (a folder and its byte bound) that also survives restarts.
    # None / None: no tier. The connector saves every computed block there and loads a prompt's
    # leading blocks back before its first step (docs/architecture.md, "Where KV lives").
    kv_offload_memory: int | None = None
    kv_offload_dir: str | None = None
    kv_offload_disk: int | None = None
    # Fields a short-name model's catalog entry set (loader/catalog.py `with_engine_defaults`),
    # with why: the start-up lines then name the entry, not a flag nobody gave.
    defaults_from: tuple[tuple[str, str], ...] = ()
