"""Activations, temporary buffers and runtime overhead: the memory that is neither weights nor
KV cache, yet must be free at the peak of a step.

A step computes `num_tokens` new tokens (at most `max_num_batched_tokens`: decode rows plus
prefill chunks) for up to `num_seqs` sequences. Layers run one after another and free their
temporaries, so the peak is the residual stream plus the largest single phase (attention, MLP,
a Mixture of Experts' experts, or the LM head with sampling), not the sum over layers. Every
figure is for one tensor-parallel rank: pass the rank's config (`tp_shard`) and the full
vocabulary, because the logits of all ranks are gathered before sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config import ModelConfig

MiB, GiB = 1 << 20, 1 << 30

# NOTE: measured, not derived: VmRSS after `import torch` was 218 MiB here (torch 2.13 CPU,
# x86-64, Python 3.11); rounded up for the tokenizer's vocabulary and the allocator's arenas.
CPU_RUNTIME_BYTES = 256 * MiB
CPU_RUNTIME_WHY = (
    "Python + the torch CPU runtime (218 MiB RSS measured after `import torch`, torch 2.13), "
    "rounded up for the tokenizer and allocator arenas"
)
# The CUDA context (driver state, loaded kernels, cuBLAS/cuDNN workspaces) takes 500 MiB to
# 1 GiB per device depending on the GPU, driver and libraries; plan with the upper end.
CUDA_CONTEXT_BYTES = 1 * GiB
CUDA_CONTEXT_WHY = (
    "CUDA context, kernels and library workspaces: 500 MiB-1 GiB per device depending on GPU "
    "and driver, 1 GiB assumed; invisible to torch.cuda.memory_allocated()"
)

ATTENTION_BACKENDS = ("torch", "fused")


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    phase: str  # the phase of the step it lives in ("all" for the residual stream)
    why: str


@dataclass(frozen=True)
class ActivationEstimate:
    terms: list[Term]
    phases: dict[str, int]  # phase → bytes alive at its peak (residual stream included)

    @property
    def peak_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)


def attended_keys(config: ModelConfig, context_len: int) -> int:
    """Keys the widest layer attends to at `context_len` (sliding layers stop at the window)."""
    windows = [config.layer_window(i) for i in range(config.num_layers)]
    return max(context_len if w is None else min(context_len, w) for w in windows)


def estimate_activations(
    config: ModelConfig,
    *,
    num_tokens: int,
    num_seqs: int,
    context_len: int,
    act_bytes: int,
    vocab_size: int | None = None,
    attention_backend: str = "torch",
) -> ActivationEstimate:
    """Peak temporary memory of one step on one rank.

    `config` is the rank's slice of the model; `vocab_size` the full vocabulary (default: the
    config's). `attention_backend="torch"` is the reference backend, which materialises the
    attention scores and gathers each decode row's K/V out of the pages; a fused (flash-style)
    kernel keeps both on chip ("fused").
    """
    if attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)} "
            f"(got {attention_backend!r})"
        )
    t, s, b = num_tokens, num_seqs, act_bytes
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    nh, nkv = config.num_heads, config.num_kv_heads
    vocab = vocab_size if vocab_size is not None else config.vocab_size
    keys = attended_keys(config, context_len)

    terms = [
        Term("residual stream", 2 * t * h * b, "all",
             "tokens × hidden: the running hidden states and the sum a block adds to them"),
        Term("norm temporaries", t * h * (4 + b), "attention",
             "RMSNorm works in float32 (4 bytes) and casts its output back"),
        Term("q/k/v and attention output", t * hd * (3 * nh + 3 * nkv) * b, "attention",
             "fused q/k/v projection, q and k after norm/RoPE, and the heads' output"),
    ]  # fmt: skip
    if attention_backend == "torch":
        terms += [
            Term("attention scores", t * nh * keys * (b + 8), "attention",
                 f"tokens × heads × {keys} keys, in the model dtype, then float32 masked "
                 "and float32 softmax (the reference backend materialises them)"),
            Term("gathered K/V", (s + 1) * keys * 2 * nkv * hd * b, "attention",
                 "decode rows (and one prefill chunk) copy their context's K and V out of "
                 "the pages: one layer's KV of the whole batch"),
        ]  # fmt: skip
    moe = config.moe
    if moe is None or len(moe.dense_layers) > 0:
        terms.append(Term("MLP intermediate", 4 * t * inter * b, "mlp",
                          "tokens × intermediate × 4: the [gate | up] output, the activation "
                          "and the gated product"))  # fmt: skip
    if moe is not None:
        pairs, e_inter = t * min(moe.top_k, moe.num_experts), moe.intermediate_size
        terms += [
            Term("router scores", 2 * t * moe.num_experts * 4, "experts",
                 f"tokens × {moe.num_experts} experts: float32 scores and softmax"),
            Term("rows by expert", pairs * h * (b + 4), "experts",
                 f"tokens × {moe.top_k} (token, expert) pairs: the gathered inputs, and the "
                 "experts' float32 outputs before they are summed into their tokens"),
            Term("expert intermediate", 4 * pairs * e_inter * b, "experts",
                 "pairs × the experts' intermediate × 4, as the dense MLP's"),
        ]  # fmt: skip
        if moe.shared_intermediate_size:
            terms.append(Term("shared expert intermediate",
                              4 * t * moe.shared_intermediate_size * b, "experts",
                              "tokens × the shared expert's intermediate × 4"))  # fmt: skip
    terms += [
        Term("logits", s * vocab * (b + 4), "lm head + sampling",
             f"only the {s} sampled rows go through the LM head: {vocab} logits each in the "
             "model dtype, then float32"),
        Term("sampling", s * vocab * 4, "lm head + sampling",
             "the sampler's float32 probabilities over the vocabulary"),
    ]  # fmt: skip
    residual = terms[0].bytes
    phases: dict[str, int] = {}
    for term in terms[1:]:
        phases[term.phase] = phases.get(term.phase, residual) + term.bytes
    return ActivationEstimate(terms, phases)


def runtime_overhead(device: str) -> Term:
    """Memory the process needs before any model tensor: per device."""
    if device == "cuda":
        return Term("runtime overhead", CUDA_CONTEXT_BYTES, "all", CUDA_CONTEXT_WHY)
    if device == "cpu":
        return Term("runtime overhead", CPU_RUNTIME_BYTES, "all", CPU_RUNTIME_WHY)
    raise ValueError(f"device must be 'cpu' or 'cuda' (got {device!r})")
