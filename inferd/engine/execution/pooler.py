"""Pooling a prompt's final hidden states into one embedding, on the device side, chunk by chunk.

An embedding request is prefilled like any prompt, possibly in several chunks (chunked prefill),
so its pooling is incremental: each step the runner hands back the part of the chunk's hidden
states the pooling needs (`chunk_part`), the sequence's `PoolingState` folds it in, and the step
that computes the prompt's last token finishes the vector (`PoolingState.finish`):

    last   the last token's hidden state: only the final chunk's last row matters
    mean   the sum over every chunk (float32), divided by the prompt's length at the end
    cls    the first token's hidden state: the first chunk's first row

NOTE: `mean` and `cls` need the hidden state of every prompt position from the first one, so
their requests never start from a cached prefix (the scheduler skips the lookup, as for prompt
logprobs), and a preempted one recomputes from position 0, which resets its state here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferd.pooling_params import PoolingParams


def chunk_part(hidden: torch.Tensor, pooling_type: str, num_computed: int) -> torch.Tensor | None:
    """What of one chunk's hidden states [tokens, hidden] (positions num_computed onwards) the
    pooling keeps, as float32 [hidden]; None when this chunk adds nothing."""
    if pooling_type == "last":
        return hidden[-1].float()
    if pooling_type == "mean":
        return hidden.float().sum(0)
    return hidden[0].float() if num_computed == 0 else None  # cls


@dataclass
class PoolingState:
    """One embedding request's pooling so far (a DeviceSequence holds it)."""

    params: PoolingParams  # resolved: every field set (PoolingParams.resolve)
    partial: torch.Tensor | None = None  # last/cls: the row kept; mean: the running sum

    def add(self, part: torch.Tensor | None, num_computed: int) -> None:
        if num_computed == 0:  # the first chunk, or a recompute after preemption
            self.partial = None
        if part is None:
            return
        if self.params.pooling_type == "mean" and self.partial is not None:
            self.partial = self.partial + part
        elif self.params.pooling_type != "cls" or self.partial is None:
            self.partial = part

    def finish(self, num_prompt_tokens: int) -> list[float]:
        """The embedding: pooled, cut to `dimensions`, then scaled to unit length if asked."""
        if self.partial is None:
            raise RuntimeError("pooling finished before any hidden state arrived")
        vector = self.partial
        if self.params.pooling_type == "mean":
            vector = vector / num_prompt_tokens
        if self.params.dimensions is not None:
            vector = vector[: self.params.dimensions]
        if self.params.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        self.partial = None
        return vector.cpu().tolist()
