"""Engine behaviour must not change greedy outputs: batching, chunked prefill, preemption and
recompute, prefix caching and speculative decoding.

* The default mode (GGUF blocks, the C decoder layer at every step, docs/performance.md): a
  prompt's greedy tokens alone equal those in a batch of all prompts, prefilled in chunks of
  16 and of 64 tokens, after preemption and recompute, and with n-gram speculation, token for
  token, on a tiny random GGUF model (in every kernel variant this CPU runs, each against
  itself) and on the embedded model.
* The float32 mode (the HF parity mode): batching, preemption and prefix caching.
"""

from __future__ import annotations

import random

import pytest
from kernel_variants import VARIANT_NAMES, use_variant
from tiny_gguf import VOCAB, write_tiny_gguf

from inferd import LLM, SamplingParams
from inferd.memory.kv import block_bytes

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
               "prompt_lookup_min": 2}  # fmt: skip


def _prompts(n: int, seed: int = 0, low: int = 1000, high: int = 20000) -> list[list[int]]:
    rng = random.Random(seed)
    # Mixed lengths, ordinary vocabulary ids (avoid the control-token range).
    return [[2] + [rng.randrange(low, high) for _ in range(rng.randrange(3, 90))] for _ in range(n)]


def _repeating(n: int, seed: int, low: int, high: int) -> list[list[int]]:
    """Prompts that repeat a phrase: n-gram lookup finds drafts in them."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(low, high) for _ in range(rng.randrange(4, 9))] for _ in range(n)]
    return [[2] + p * rng.randrange(3, 7) for p in phrases]


def _ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def _tight_kv(llm: LLM, blocks: int) -> int:
    """Bytes of `blocks` KV blocks of 16 tokens in every KV group (in `llm`'s cache dtype)."""
    cfg, width = llm.engine.model_config, llm.engine.runner.kv_caches[0][0].element_size()
    return blocks * sum(block_bytes(cfg, len(layers), 16, width) for _, layers in cfg.kv_groups())


def _llm(model: str | None, **flags) -> LLM:
    """An engine; a tiny test file's blocks stay out of the user's weight cache."""
    with pytest.MonkeyPatch.context() as patch:
        if model is not None:
            patch.setenv("INFERD_WEIGHT_CACHE", "0")
        return LLM(model=model, **flags)


class DefaultMode:
    """One model in the default mode: `alone`, each prompt's greedy tokens run by itself, and
    engines of the same model with other flags."""

    def __init__(self, base: LLM, model: str | None, prompts: list[list[int]]):
        self.base, self.model, self.prompts = base, model, prompts
        base.engine.kv.reset_prefix_cache()  # alone runs must compute, not reuse
        self.alone = [_ids(base.generate([p], LONG, use_tqdm=False))[0] for p in prompts]

    def engine(self, **flags) -> LLM:
        flags.setdefault("kv_cache_memory", 256 << 20)
        return _llm(self.model, **flags)

    def check(self, llm: LLM, longest: int | None = None) -> None:
        """All prompts (of at most `longest` tokens) together on `llm` give the tokens alone."""
        chosen = [i for i, p in enumerate(self.prompts) if longest is None or len(p) <= longest]
        together = _ids(llm.generate([self.prompts[i] for i in chosen], LONG, use_tqdm=False))
        differ = [i for i, ids in zip(chosen, together, strict=True) if ids != self.alone[i]]
        assert not differ, f"prompts {differ} of {len(chosen)} differ"


@pytest.fixture(scope="module", params=["tiny", "embedded"])
def default_mode(request, tmp_path_factory, c_kernels):
    if request.param == "embedded":
        base = request.getfixturevalue("default_llm")
        # one prompt past the sliding window (512): chunks there cross it differently
        long = [2] + [random.Random(8).randrange(1000, 20000) for _ in range(560)]
        prompts = _prompts(4, seed=3) + _repeating(3, 4, 1000, 20000) + [long]
        return DefaultMode(base, None, prompts)
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen3.gguf"  # q/k norms, several widths
    write_tiny_gguf(path, "qwen3")
    prompts = _prompts(10, seed=5, low=3, high=VOCAB) + _repeating(6, 6, 3, VOCAB)
    mode = DefaultMode(_llm(str(path), kv_cache_memory=64 << 20), str(path), prompts)
    assert mode.base.engine.runner.model.cpu_decoder is not None
    return mode


@pytest.mark.slow
def test_default_mode_batch_invariance(default_mode):
    default_mode.check(default_mode.base)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [16, 64])
def test_default_mode_chunked_prefill_invariance(default_mode, budget):
    llm = default_mode.engine(max_num_batched_tokens=budget, max_num_seqs=16)
    default_mode.check(llm)


@pytest.mark.slow
def test_default_mode_preemption_invariance(default_mode):
    # 32 usable blocks of 16 tokens per group: the prompts need far more at once
    tight = default_mode.engine(kv_cache_memory=_tight_kv(default_mode.base, 33),
                                max_model_len=256, enable_prefix_caching=False)  # fmt: skip
    default_mode.check(tight, longest=256 - LONG.max_tokens)
    assert tight.engine.stats().num_preemptions > 0


@pytest.mark.slow
def test_default_mode_speculation_invariance(default_mode):
    spec = default_mode.engine(speculative_config=SPECULATION)
    spec.engine.speculation.adaptive = False  # verify every draft found
    default_mode.check(spec)
    assert spec.engine.speculation.metrics.num_draft_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_each_kernel_variant_against_itself(tmp_path, monkeypatch, variant):
    """Every variant this CPU runs keeps a row's bits whatever its step (on the tiny model:
    alone, in a batch, prefilled in chunks of 16 tokens)."""
    use_variant(monkeypatch, variant)  # emulated, or skipped saying why, where the CPU lacks it
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    prompts = _prompts(6, seed=7, low=3, high=VOCAB)
    mode = DefaultMode(_llm(str(path), kv_cache_memory=16 << 20), str(path), prompts)
    mode.check(mode.base)
    mode.check(mode.engine(kv_cache_memory=16 << 20, max_num_batched_tokens=16))


@pytest.mark.slow
def test_batch_invariance(gemma_llm):
    prompts = _prompts(8)
    together = _ids(gemma_llm.generate(prompts, GREEDY, use_tqdm=False))
    gemma_llm.engine.kv.reset_prefix_cache()  # alone runs must compute, not reuse
    alone = [_ids(gemma_llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    assert together == alone


@pytest.mark.slow
def test_preemption_gives_the_same_outputs(gemma_llm):
    prompts = _prompts(8, seed=1)
    reference = _ids(gemma_llm.generate(prompts, GREEDY, use_tqdm=False))
    # 26 usable blocks of 16 tokens per group (+ the null block): 8 sequences of up to 106
    # tokens need up to 56 at once, so running them forces preemption.
    tight = LLM(
        dtype="float32",
        kv_cache_memory=_tight_kv(gemma_llm, 27),
        max_model_len=256,
        enable_prefix_caching=False,
        max_num_batched_tokens=256,
    )
    outs = tight.generate(prompts, GREEDY, use_tqdm=False)
    assert tight.engine.stats().num_preemptions > 0
    assert _ids(outs) == reference


@pytest.mark.slow
def test_prefix_cache_skips_shared_prompt_and_keeps_output(gemma_llm):
    engine = gemma_llm.engine
    shared = _prompts(1, seed=2)[0] * 3  # ~100-250 tokens
    first = gemma_llm.generate([shared + [500, 600]], GREEDY, use_tqdm=False)
    before = engine.stats()
    second = gemma_llm.generate([shared + [700]], GREEDY, use_tqdm=False)
    after = engine.stats()
    computed = after.prompt_tokens - before.prompt_tokens
    assert after.prefix_cache_hits - before.prefix_cache_hits >= len(shared) - 16
    assert computed <= 16 + 1
    engine.kv.reset_prefix_cache()
    fresh = gemma_llm.generate([shared + [700]], GREEDY, use_tqdm=False)
    assert _ids(second) == _ids(fresh)
    assert first[0].num_cached_tokens < second[0].num_cached_tokens
