"""One row of a step's logits as the sampler sees it: the request's params and the tokens its
penalties and grammar read. Its own module because the sampler's steps in other files
(filters.py, penalties.py) take rows too, and the sampler imports them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferd.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """One row of the batch's logits."""

    params: SamplingParams
    prompt_token_ids: list[int]  # for repetition_penalty
    output_token_ids: list[int]  # generated so far (penalties, min_tokens)
    generator: torch.Generator | None  # the request's own when params.seed is set
    eos_token_ids: tuple[int, ...] = ()  # held back while len(output) < min_tokens
    # Structured outputs: the tokens the sequence's grammar allows here (the step record's
    # bitmask: int32 words, little-endian bytes), None when free.
    grammar_mask: bytes | None = None
    # Record the generator's state after this row's draw (a seeded row verifying drafts).
    keep_generator_state: bool = False
