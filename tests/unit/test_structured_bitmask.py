"""Applying bitmask rows to logits (equal to a per-token reference; unconstrained rows untouched)
and the sampler's check-first path giving exactly the tokens of masking every row first."""

from __future__ import annotations

import pytest
import torch
from structured_vocab import EOS, EOT, decode, random_logits, small_info

from inferd.engine.sampling.grammar_mask import allows
from inferd.engine.sampling.sampler import Sampler, SamplingRow
from inferd.sampling_params import SamplingParams
from inferd.structured import StructuredOutputsParams
from inferd.structured.bitmask import LogitsMasker, allocate_bitmask, bitmask_allows
from inferd.structured.manager import GrammarManager


def reference_apply(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    for j, r in enumerate(rows):
        for t in range(logits.shape[1]):
            word = t // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[j, word]) >> (t % 32)) & 1
            if not allowed:
                out[r, t] = float("-inf")
    return out


@pytest.mark.parametrize(
    ("vocab", "words", "dtype"),
    [
        (256, 8, torch.float32),  # a multiple of 32
        (300, 10, torch.float32),  # the last word half used
        (300, 9, torch.float32),  # ids past the mask (past the tokenizer): banned
        (300, 10, torch.bfloat16),  # the torch path
    ],
)
def test_apply_equals_reference(vocab, words, dtype):
    g = torch.Generator().manual_seed(vocab + words)
    logits = (torch.randn(5, vocab, generator=g) * 4).to(dtype)
    logits[1, 7] = float("inf")  # an extreme logit stays extreme
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=g)
    bitmask[2] = 0
    bitmask[2, 0] = 1 << 5  # a row allowing a single token
    rows = [3, 1, 0]
    expect = reference_apply(logits, bitmask, rows)
    LogitsMasker(vocab, words).apply(logits, bitmask, rows)
    assert torch.equal(logits, expect)  # rows 2 and 4 are untouched, bit for bit
    assert torch.isinf(logits[0]).sum() == vocab - 1


def test_apply_checks_shapes():
    masker = LogitsMasker(64, 2)
    with pytest.raises(ValueError, match=r"logits must be \[batch, 64\]"):
        masker.apply(torch.zeros(2, 63), torch.zeros(1, 2, dtype=torch.int32), [0])
    with pytest.raises(ValueError, match="bitmask has 1 rows for 2 logits rows"):
        masker.apply(torch.zeros(2, 64), torch.zeros(1, 2, dtype=torch.int32), [0, 1])
    masker.apply(torch.zeros(2, 64), torch.zeros(1, 2, dtype=torch.int32), [])  # nothing to do


def test_bitmask_allows():
    row = torch.zeros(2, dtype=torch.int32)
    row[1] = -(2**31)  # bit 31 of word 1: token 63
    assert bitmask_allows(row, 63)
    assert not any(bitmask_allows(row, t) for t in (0, 31, 62, 64, -1))


SPECS = [
    StructuredOutputsParams(regex=r"[a-c]{2,6}-[0-9]{1,3}"),
    StructuredOutputsParams(
        json={
            "type": "object",
            "properties": {"k": {"type": "string", "maxLength": 4}, "v": {"type": "boolean"}},
            "required": ["k", "v"],
        },
        disable_any_whitespace=True,
        disable_additional_properties=True,
    ),
    StructuredOutputsParams(choice=["yes", "no", "abc"]),
]


def steer(logits: torch.Tensor, matchers, g: torch.Generator, info) -> None:
    """Like a model that mostly follows its instructions: most steps, one allowed token of each
    constrained row gets a large logit (so check-first mostly accepts)."""
    bitmask = allocate_bitmask(1, info.bitmask_words)
    for row, m in enumerate(matchers):
        if m is None or torch.rand(1, generator=g).item() < 0.3:
            continue
        m.fill_bitmask(bitmask, 0)
        ok = [t for t in range(info.vocab_size) if bitmask_allows(bitmask[0], t)]
        logits[row, ok[int(torch.randint(len(ok), (1,), generator=g))]] += 30.0


def decode_batch(manager, check_first: bool, seed: int, steps: int = 60):
    """A batch of constrained and free rows decoded greedily by the engine's sampler, with a
    logit bias (a processor acting on each token alone, as the penalties do); returns the ids
    per row and the constraint statistics. Rows asking for logprobs are masked first, the
    others checked first."""
    info = manager.info
    g = torch.Generator().manual_seed(seed)
    bias = {t: float(torch.randn(1, generator=g)) for t in range(0, info.vocab_size, 3)}
    params = SamplingParams(temperature=0, logit_bias=bias,
                            logprobs=None if check_first else 0)  # fmt: skip
    matchers = [manager.compile(s) for s in SPECS] + [None]
    sampler = Sampler()
    bitmask = allocate_bitmask(1, info.bitmask_words)
    out: list[list[int]] = [[] for _ in matchers]
    for _ in range(steps):
        live = [i for i, m in enumerate(matchers) if m is None or not m.is_terminated]
        logits = random_logits(g, len(matchers))[live]
        steer(logits, [matchers[i] for i in live], g, info)
        rows = []
        for i in live:
            mask = None
            if matchers[i] is not None:
                matchers[i].fill_bitmask(bitmask, 0)
                mask = bitmask[0].numpy().tobytes()
            rows.append(SamplingRow(params, [], list(out[i]), None, grammar_mask=mask))
        tokens = sampler(logits, rows).token_ids
        for i, t in zip(live, tokens, strict=True):
            out[i].append(t)
            if matchers[i] is not None:
                assert matchers[i].accept_tokens([t])
    return out, sampler.grammar.stats


@pytest.mark.parametrize("seed", range(6))
def test_check_first_gives_the_tokens_of_full_masking(seed):
    with GrammarManager(small_info()) as manager:
        masked, mask_stats = decode_batch(manager, check_first=False, seed=seed)
        checked, check_stats = decode_batch(manager, check_first=True, seed=seed)
    assert checked == masked
    for ids in masked[:-1]:
        assert ids[-1] in (EOS, EOT), decode(ids)
    # Both paths of check-first ran: accepted as sampled, and resampled under the mask.
    assert 0 < check_stats.rejected < check_stats.checked
    assert check_stats.masked == check_stats.rejected < mask_stats.masked
    assert mask_stats.checked == 0


def test_the_samplers_bit_lookup_agrees_with_the_tensor_one():
    row = torch.zeros(3, dtype=torch.int32)
    row[1] = -(2**31)  # bit 31 of word 1: token 63
    row[2] = 5  # tokens 64 and 66
    mask = row.numpy().tobytes()
    for t in range(-1, 100):
        assert allows(mask, t) == bitmask_allows(row, t), t
