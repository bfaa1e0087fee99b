"""A small vocabulary for the structured-output tests, and a fake decode loop over it.

Every byte is a token (so any text can be spelled), plus multi-byte tokens that cross grammar
boundaries (`{"`, `": `, `true`, ...) and two end tokens, EOS and end-of-turn, like Gemma's. The
"model" draws seeded random logits each step: whatever a grammar allows, some run will try it.
"""

from __future__ import annotations

import torch

from inferd.structured.bitmask import LogitsMasker, allocate_bitmask
from inferd.structured.matcher import GrammarMatcher
from inferd.structured.tokenizer_info import TokenizerInfo, tokenizer_info_from_tokens

MULTI = ['{"', '": ', '", "', "true", "false", "null", "ab", "abc", "-1", "12", "  ", "\n", "yes"]
TOKENS = [bytes([b]) for b in range(256)] + [t.encode() for t in MULTI] + [b"<eos>", b"<eot>"]
EOS, EOT = len(TOKENS) - 2, len(TOKENS) - 1
VOCAB = 300  # the "model's" vocabulary: wider than the tokenizer's, as Gemma's is


def small_info() -> TokenizerInfo:
    return tokenizer_info_from_tokens(
        TOKENS, eos_token_ids=[EOS, EOT], vocab_size=VOCAB, special_token_ids=[EOS, EOT]
    )


def decode(ids: list[int]) -> str:
    return b"".join(TOKENS[i] for i in ids if i not in (EOS, EOT)).decode("utf-8", "replace")


def random_logits(generator: torch.Generator, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=generator) * 3.0


def constrained_run(
    matcher: GrammarMatcher, info: TokenizerInfo, seed: int, max_tokens: int = 200
) -> list[int]:
    """Sample (temperature 1) under the full mask until EOS or `max_tokens`; returns the ids."""
    generator = torch.Generator().manual_seed(seed)
    masker = LogitsMasker(info.vocab_size, info.bitmask_words)
    bitmask = allocate_bitmask(1, info.bitmask_words)
    out: list[int] = []
    while len(out) < max_tokens and not matcher.is_terminated:
        logits = random_logits(generator)
        matcher.fill_bitmask(bitmask, 0)
        masker.apply(logits, bitmask, [0])
        token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator))
        assert matcher.accept_tokens([token]), f"the mask allowed {token}, the matcher refused it"
        out.append(token)
    return out
