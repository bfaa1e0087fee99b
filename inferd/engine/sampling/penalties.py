"""The logit processors that run before sampling, in this order:

1. logit_bias: the bias is added to the named token's logit.
2. min_tokens: while a row has generated fewer than `min_tokens` tokens, its `stop_token_ids`
   and, unless `ignore_eos`, its EOS ids are set to -inf. (With `ignore_eos` the EOS token does
   not end the request, so it is an ordinary token and is not held back; vLLM does the same.)
3. repetition_penalty p (CTRL / HF / vLLM convention): every token that occurs in the prompt OR
   in the output so far has its logit divided by p when positive, multiplied by p otherwise.
4. frequency_penalty f and presence_penalty q (OpenAI convention), counted on the OUTPUT only:
   logit -= f * count(token in output); logit -= q if the token occurs in the output.

Only the (row, token) pairs a processor touches are read and written: a penalised row rarely
mentions more than a few thousand of the vocabulary's 262144 tokens, so the work is a gather and
a scatter over those pairs rather than passes over [B, V] count tensors, and rows whose knob is
off are not touched at all (bit-for-bit).
"""

from __future__ import annotations

import torch

from inferd.engine.sampling.sampling_row import SamplingRow


def apply_logit_processors(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Steps 1-4 on float32 `logits` [B, V]. Returns `logits` itself when no row uses any of
    them (no copy), else a processed copy; the caller's tensor is never written."""
    bias = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
    banned = [(i, ids) for i, r in enumerate(rows) if (ids := _held_back(r))]
    repetition = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    counted = [
        i
        for i, r in enumerate(rows)
        if (r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0)
        and r.output_token_ids
    ]
    if not (bias or banned or repetition or counted):
        return logits
    x = logits.clone()
    if bias:
        idx = [(i, t, b) for i, table in bias for t, b in table.items()]
        r, t, b = zip(*idx, strict=True)
        vals = torch.tensor(b, dtype=x.dtype, device=x.device)
        x.index_put_((_long(r, x), _long(t, x)), vals, accumulate=True)
    if banned:
        r = [i for i, ids in banned for _ in ids]
        t = [t for _, ids in banned for t in ids]
        x.index_put_((_long(r, x), _long(t, x)), torch.tensor(float("-inf"), device=x.device))
    if repetition:
        _repetition_penalty(x, rows, repetition)
    if counted:
        _frequency_presence(x, rows, counted)
    return x


def _held_back(row: SamplingRow) -> list[int]:
    """Token ids that may not be sampled yet because min_tokens is not reached."""
    p = row.params
    if len(row.output_token_ids) >= p.min_tokens:
        return []
    eos = [] if p.ignore_eos else list(row.eos_token_ids)
    return list(p.stop_token_ids or ()) + eos


def _long(values, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64, device=like.device)


def _keys(x: torch.Tensor, token_lists: list[tuple[int, list[int]]]) -> torch.Tensor:
    """Flat indices row * V + token into x, one per listed token (repeats included)."""
    vocab = x.shape[1]
    return torch.cat([_long(ids, x) + row * vocab for row, ids in token_lists])


def _repetition_penalty(x: torch.Tensor, rows: list[SamplingRow], which: list[int]) -> None:
    lists = [(i, rows[i].prompt_token_ids + rows[i].output_token_ids) for i in which]
    lists = [(i, ids) for i, ids in lists if ids]
    if not lists:
        return
    # NOTE: no de-duplication: every copy of a repeated (row, token) computes the same new value
    # from the same old one, so writing it several times is harmless, and `unique` on CPU costs
    # more than the whole rest of the step (a long prompt has thousands of repeats).
    keys = _keys(x, lists)
    flat = x.view(-1)  # x is the processor's own contiguous copy
    penalty = torch.tensor(
        [row.params.repetition_penalty for row in rows], dtype=x.dtype, device=x.device
    )[keys // x.shape[1]]
    vals = flat[keys]
    flat[keys] = torch.where(vals > 0, vals / penalty, vals * penalty)


def _frequency_presence(x: torch.Tensor, rows: list[SamplingRow], which: list[int]) -> None:
    # Counts need distinct pairs; outputs are short next to prompts, so `unique` is cheap here.
    keys, n = torch.unique(
        _keys(x, [(i, rows[i].output_token_ids) for i in which]), return_counts=True
    )
    row = keys // x.shape[1]
    freq = torch.tensor([r.params.frequency_penalty for r in rows], device=x.device)
    pres = torch.tensor([r.params.presence_penalty for r in rows], device=x.device)
    flat = x.view(-1)
    # Two subtractions in the order of the formula in the docstring, so a reference written
    # from it matches to the last bit.
    vals = flat[keys] - freq[row] * n.to(x.dtype)
    flat[keys] = vals - pres[row]
