"""Tiny random HF checkpoints written by the tests themselves: a small trained BPE tokenizer and
a few-layer model per architecture, saved with `save_pretrained` as safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Inference engines batch requests and page their key-value caches.",
    "def add(a, b):\n    return a + b\n",
    "Prefill computes the prompt; decode produces one token at a time.",
    "Memory = weights + KV cache + activations + overhead.",
    "numbers 0123456789 and symbols !?@#$%^&*()[]{}",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# name → (HF config class name, model class name, config kwargs)
TINY_CONFIGS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=7, head_dim=16),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=2),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=7),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),  # a dense layer between two sparse ones
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        ),
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            intermediate_size=32,
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=32,
            sliding_window=7,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=6,  # shorter than the test prompts
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=24,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=6,  # shorter than the test prompts; layers 0 and 2 slide
            query_pre_attn_scalar=8,  # a query scale twice 1/sqrt(head_dim)
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            initializer_range=0.15,  # scores large enough for the soft-caps to bite, not saturate
            tie_word_embeddings=True,  # llama.cpp's gemma2 files have no output matrix
        ),
    ),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
            logits_scaling=4.0,
        ),
    ),
    "olmo2": (
        "Olmo2Config",
        "Olmo2ForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=2),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=32,  # each expert's (a multiple of MXFP4's blocks of 32)
            sliding_window=6,  # shorter than the test prompts; even layers slide (HF's default)
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,  # gpt-oss's own
                "original_max_position_embeddings": 64,  # x factor = max_position_embeddings
            },
        ),
    ),
}
# Parameters HF initialises to zero (biases) or near it (sinks) that the tests must see used;
# gpt-oss's gate/up weights large enough for some values to pass its SwiGLU's clamps (at 7).
_RANDOMISED = {"gpt_oss": {"bias": 0.1, "sinks": 2.0, "gate_up_proj": 0.6}}


# Qwen2.5-Coder's fill-in-the-middle tokens (prefix, suffix, middle, pad, repo name, file
# separator), for tokenizers trained with `fim=True`: ids 4..9.
FIM_SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>"]  # fmt: skip


def train_tokenizer(folder: Path, vocab_size: int = 300, fim: bool = False) -> int:
    """Train a byte-level BPE on CORPUS and write tokenizer.json + tokenizer_config.json;
    `fim`: with FIM_SPECIALS as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<pad>"] + FIM_SPECIALS * fim
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "add_bos_token": True,
                "chat_template": CHAT_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return tok.get_vocab_size()


def make_tiny_model(kind: str, folder: Path, seed: int = 0, fim: bool = False, **overrides):
    """The tiny HF model of `kind` (float32, eval) and its tokenizer written to `folder`
    (`fim`: with fill-in-the-middle tokens, train_tokenizer)."""
    import transformers

    cfg_cls, model_cls, extra = TINY_CONFIGS[kind]
    folder.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(folder, fim=fim)
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        initializer_range=0.1,  # peakier logits than the default, so greedy ties are unlikely
        tie_word_embeddings=False,
    )
    kwargs.update(extra)
    kwargs.update(overrides)
    config = getattr(transformers, cfg_cls)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    # Norm weights start at 1 (or 0 for Gemma); randomise them so the tests see them used.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            for part, scale in _RANDOMISED.get(kind, {}).items():
                if name.endswith(part):
                    p.copy_(torch.randn_like(p) * scale)
    return model


def make_tiny_checkpoint(kind: str, folder: Path, seed: int = 0, fim: bool = False,
                         **overrides) -> Path:  # fmt: skip
    """A tiny random checkpoint of `kind` saved with `save_pretrained` (MoE experts one tensor
    each: transformers 5 writes the per-expert layout) in `folder`."""
    model = make_tiny_model(kind, folder, seed, fim, **overrides)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    )
    return folder


def hf_greedy(model, prompt: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """(last-position float32 logits of the prompt, n greedy tokens) with HF's KV cache."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        first = out.logits[0, -1].float().clone()
        past, tokens = out.past_key_values, []
        token = int(out.logits[0, -1].argmax())
        for _ in range(n):
            tokens.append(token)
            out = model(torch.tensor([[token]]), cache=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
    return first, tokens
