"""Log-probabilities reported to the user, for generated tokens and for prompt tokens.

They are those of the RAW model distribution, `log_softmax` of the float32 logits before any
bias, penalty, temperature or filtering (vLLM's default, and what the OpenAI API documents), so
they do not change when a client changes its sampling knobs.

Ranks follow one total order: higher logprob first, then lower token id. The chosen token's rank
is 1 + the number of tokens before it in that order, so it agrees with the positions of the
listed alternatives even when logprobs tie.
"""

from __future__ import annotations

import torch

from inferd.outputs import Logprob, PositionLogprobs

# Rows per log_softmax: a [rows, 262144] float32 temporary is 1 MiB a row, so a long prompt's
# logprobs are computed in slices rather than all at once.
ROWS_PER_CHUNK = 64


def position_logprobs(
    logits: torch.Tensor, token_ids: list[int], num_top: list[int]
) -> list[PositionLogprobs]:
    """For each row of `logits` [R, V]: {token_ids[i]: Logprob, then the num_top[i] most likely
    tokens in rank order} (the chosen token appears once, first)."""
    out: list[PositionLogprobs] = []
    for start in range(0, logits.shape[0], ROWS_PER_CHUNK):
        end = start + ROWS_PER_CHUNK
        out += _chunk(logits[start:end], token_ids[start:end], num_top[start:end])
    return out


def _chunk(
    logits: torch.Tensor, token_ids: list[int], num_top: list[int]
) -> list[PositionLogprobs]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    vocab = lp.shape[1]
    chosen = torch.as_tensor(token_ids, dtype=torch.int64, device=lp.device).unsqueeze(1)
    chosen_lp = lp.gather(1, chosen)
    greater = (lp > chosen_lp).sum(1)
    ahead = greater.tolist()
    # Tokens tied with the chosen one rank ahead of it when their id is lower. Ties are rare,
    # so only those rows pay for a second look.
    tied = ((lp >= chosen_lp).sum(1) - greater > 1).nonzero().flatten().tolist()
    for r in tied:
        lower = lp[r, : token_ids[r]] == chosen_lp[r]
        ahead[r] += int(lower.sum())
    result = [
        {t: Logprob(v, a + 1)}
        for t, v, a in zip(token_ids, chosen_lp.squeeze(1).tolist(), ahead, strict=True)
    ]
    k = min(max(num_top, default=0), vocab)
    if k == 0:
        return result
    for row, (tokens, values) in enumerate(_top_tokens(lp, k)):
        entry = result[row]
        for rank, (t, v) in enumerate(zip(tokens[: num_top[row]], values, strict=False), start=1):
            if t not in entry:
                entry[t] = Logprob(v, rank)
    return result


def _top_tokens(lp: torch.Tensor, k: int) -> list[tuple[list[int], list[float]]]:
    """Per row, the k best (token ids, logprobs) in rank order, ties broken by lower id."""
    vocab = lp.shape[1]
    # One more than asked: when the (k+1)-th value is below the k-th, the k best are known and
    # only their order among equal values needs fixing.
    vals, ids = lp.topk(min(k + 1, vocab), dim=-1)
    order = ids.argsort(dim=-1)  # stable sorts: id first, then value (descending)
    vals, ids = vals.gather(1, order), ids.gather(1, order)
    order = vals.argsort(dim=-1, descending=True, stable=True)
    vals, ids = vals.gather(1, order), ids.gather(1, order)
    out = list(zip(ids[:, :k].tolist(), vals[:, :k].tolist(), strict=True))
    if k < vocab:
        # topk chose arbitrarily among values tied with the k-th: list them all, lowest ids first.
        for r in (vals[:, k] == vals[:, k - 1]).nonzero().flatten().tolist():
            better = (lp[r] > vals[r, k - 1]).nonzero().flatten()
            equal = (lp[r] == vals[r, k - 1]).nonzero().flatten()
            chosen = torch.cat([better[lp[r, better].argsort(descending=True, stable=True)], equal])
            out[r] = (chosen[:k].tolist(), lp[r, chosen[:k]].tolist())
    return out


def prompt_logprobs(
    logits: torch.Tensor, next_token_ids: list[int], k: int
) -> list[PositionLogprobs]:
    """Logprobs of a prompt's tokens: `logits` [P, V] float32 are those of prompt positions
    0..P-1 and next_token_ids[i] is the prompt token at position i + 1, so entry i holds that
    token's Logprob and the k most likely tokens at that position."""
    if logits.dim() != 2 or logits.shape[0] != len(next_token_ids):
        raise ValueError(
            f"prompt_logprobs needs one next token per logits row, got logits of shape "
            f"{tuple(logits.shape)} and {len(next_token_ids)} token ids"
        )
    if k < 0:
        raise ValueError(f"prompt_logprobs k must be >= 0, got {k}")
    return position_logprobs(logits, next_token_ids, [k] * len(next_token_ids))
