"""The sampler's filters, row by row (sampler.py's steps 0 and 7-9): allowed_token_ids, and
which of a row's best logits survive top-k, top-p and min-p. Every filter is a threshold on the
sorted logits, so a row's kept set is a prefix of them: `keep_mask` can tell, from a window of the
best candidates alone, whether the kept set ends inside the window."""

from __future__ import annotations

import torch

from inferd.engine.sampling.sampling_row import SamplingRow
from inferd.sampling_params import SamplingParams


def restrict_to_allowed(
    x: torch.Tensor, raw: torch.Tensor, rows: list[SamplingRow]
) -> torch.Tensor:
    """Step 0 (vLLM's `allowed_token_ids`): every other token of the row at -inf. Returns `x`
    itself when no row restricts; never writes `raw` (logprobs read it)."""
    restricted = [i for i, r in enumerate(rows) if r.params.allowed_token_ids]
    if not restricted:
        return x
    if x is raw:
        x = raw.clone()
    for i in restricted:
        ids = torch.as_tensor(rows[i].params.allowed_token_ids, dtype=torch.int64, device=x.device)
        kept = x[i, ids]
        x[i] = float("-inf")
        x[i, ids] = kept
    return x


def filtered(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def keep_mask(
    x: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the sorted candidates `vals` [R, W] survive top-k, top-p and min-p, and whether
    each row's kept set is known to end inside the window. Every filter keeps a prefix of the
    sorted logits, so a row fits when its last candidate is dropped."""
    rows, width = vals.shape
    vocab, dev = x.shape[1], x.device
    has_k = [0 < p.top_k < vocab for p in params]
    k = [min(p.top_k, width) if on else width for p, on in zip(params, has_k, strict=True)]
    kth = vals.gather(1, torch.tensor(k, device=dev).unsqueeze(1) - 1)
    keep = vals >= kth
    fits = torch.ones(rows, dtype=torch.bool, device=dev)
    nucleus = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if nucleus:
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        # Without top-k the mass is over the whole vocabulary, not just the window.
        whole = [i for i in nucleus if not has_k[i] and width < vocab]
        if whole:
            full = torch.softmax(take_rows(x, whole), dim=-1).gather(1, take_rows(ids, whole))
            if len(whole) == rows:
                probs = full
            else:
                probs[row_index(whole, x)] = full
        top_p = torch.tensor([p.top_p for p in params], device=dev).unsqueeze(1)
        uses = top_p < 1.0
        # Candidates whose cumulative mass is still below top_p, then the one that reaches it.
        before = (probs.cumsum(dim=-1) < top_p).sum(dim=-1, keepdim=True)
        # A top-k row's kept set is inside the window already (the last-candidate test below
        # catches ties); the others fit only if the mass reached top_p inside the window.
        open_ended = uses.squeeze(1) & ~torch.tensor(has_k, device=dev)
        fits &= (before < width).squeeze(1) | ~open_ended
        cutoff = vals.gather(1, before.clamp(max=width - 1))
        keep &= (vals >= cutoff) | ~uses
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=dev).unsqueeze(1)
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        # NOTE: keep is a prefix of the sorted candidates, so column 0 holds the largest prob.
        keep &= probs >= min_p * probs[:, :1]
    if width < vocab:
        fits &= ~keep[:, -1]
    return keep, fits


def take_rows(x: torch.Tensor, index: list[int]) -> torch.Tensor:
    """Rows `index` of x, without a copy when that is all of them in order."""
    if index == list(range(x.shape[0])):
        return x
    return x.index_select(0, row_index(index, x))


def row_index(index: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(index, dtype=torch.int64, device=like.device)
