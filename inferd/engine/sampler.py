"""Batched sampling: a step's float32 logits [B, V] become one token per row.

Each row follows its own SamplingParams, in this order (steps 1-4 are in penalties.py, which
documents which tokens each penalty counts):

 0. allowed_token_ids: every other token at -inf (applied after steps 1-4, so no bias or
    penalty can bring a token outside the list back)
 1. logit_bias (added)            2. min_tokens (stop / EOS ids at -inf until reached)
 3. repetition_penalty (prompt and output tokens)
 4. frequency / presence penalties (output tokens only)
 5. greedy rows (temperature < 1e-5) take the argmax here, lowest id on ties; they ignore
    top_k, top_p, min_p and seed.
 6. temperature: logits / T.
 7. top_k: keep the tokens whose logit >= the k-th largest (all tokens tied with it stay).
 8. top_p: on the probabilities after top-k, keep the smallest most-likely-first set whose mass
    is >= top_p (at least one token; tokens tied with the last one kept stay too).
 9. min_p: drop the tokens whose probability (after 7-8) is < min_p × the largest one.
10. draw with the exponential race: argmax(p / E), E ~ Exp(1) independent per token. Rows whose
    request has a seed draw E from their own `generator`, everything else from the sampler's, so a
    seeded request gets the same tokens whatever else is in the batch.

Logprobs (logprobs.py) are those of the raw model distribution, before steps 0-9. A row that
follows a grammar (structured outputs) arrives here already masked (engine/structured_outputs.py),
so its logprobs are those of the masked distribution, as in vLLM.

Where the time goes. On V = 262144 one pass over a [32, V] float32 tensor costs ~10 ms on this
2-core CPU, a full sort ~350 ms and drawing V exponentials per row ~170 ms. So a row with a filter
(7-9) first looks at its `candidates` best logits only (`topk`, ~14 ms for 32 rows): if its kept
set ends inside them (decidable because every filter is a threshold on the sorted logits), it
races among the kept tokens alone, drawing one E per kept token in token-id order. Only rows
whose kept set is wider are sorted in full and race over the whole vocabulary, like unfiltered
rows. Each knob is applied only to the rows that use it; no other row's values change.

NOTE: batch invariance of seeded rows rests on every per-row computation giving the same bits
whatever the batch: the path a row takes depends on its own logits and params only, and the
reductions used (softmax, cumsum, topk) are batch-invariant on CPU; `logsumexp` is not (a lone
row is split across threads), which is why probabilities come from `softmax` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from inferd.engine.logprobs import position_logprobs, prompt_logprobs
from inferd.engine.penalties import apply_logit_processors
from inferd.outputs import PositionLogprobs
from inferd.sampling_params import SamplingParams

__all__ = ["SampleResult", "Sampler", "SamplingRow", "make_generator", "prompt_logprobs"]

CANDIDATES = 1024  # logits a filtered row looks at before falling back to a full sort


@dataclass
class SamplingRow:
    """One row of the batch's logits."""

    params: SamplingParams
    prompt_token_ids: list[int]  # for repetition_penalty
    output_token_ids: list[int]  # generated so far (penalties, min_tokens)
    generator: torch.Generator | None  # the request's own when params.seed is set
    eos_token_ids: tuple[int, ...] = ()  # held back while len(output) < min_tokens
    # Structured outputs: the sequence's GrammarMatcher (read only here: the executor's
    # StructuredOutputs masks or checks the row around this sampler).
    matcher: Any = None


@dataclass
class SampleResult:
    token_ids: list[int]  # one per row
    # Per row: None unless params.logprobs is set, else {sampled token, then the top
    # params.logprobs alternatives in rank order}.
    logprobs: list[PositionLogprobs | None]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for a seeded request; any Python int is accepted as a seed."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)  # manual_seed takes [0, 2**64) (or small negatives)
    return generator


class Sampler:
    def __init__(
        self, seed: int = 0, device: torch.device | str = "cpu", candidates: int = CANDIDATES
    ):
        self.device = torch.device(device)
        self.generator = make_generator(seed, self.device)  # for rows without a seed
        self.candidates = candidates

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"sampler needs one SamplingRow per logits row, got logits of shape "
                f"{tuple(logits.shape)} and {len(rows)} rows"
            )
        # NOTE: `raw` may be the caller's tensor; it is only read, every change goes to a copy.
        raw = logits.float()
        x = restrict_to_allowed(apply_logit_processors(raw, rows), raw, rows)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        drawn = [i for i, r in enumerate(rows) if not r.params.greedy]
        tokens = torch.empty(len(rows), dtype=torch.int64, device=x.device)
        if greedy:
            tokens[_index(greedy, x)] = argmax_rows(_take(x, greedy))
        if drawn:
            tokens[_index(drawn, x)] = self._draw(_take(x, drawn), [rows[i] for i in drawn])
        token_ids = tokens.tolist()

        logprobs: list[PositionLogprobs | None] = [None] * len(rows)
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if wanted:
            found = position_logprobs(
                _take(raw, wanted),
                [token_ids[i] for i in wanted],
                [rows[i].params.logprobs for i in wanted],
            )
            for i, entry in zip(wanted, found, strict=True):
                logprobs[i] = entry
        return SampleResult(token_ids, logprobs)

    def _draw(self, x: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Token ids for rows that sample (steps 6-10)."""
        vocab = x.shape[1]
        temperature = torch.tensor([r.params.temperature for r in rows], device=x.device)
        x = x / temperature.unsqueeze(1)
        out = torch.empty(len(rows), dtype=torch.int64, device=x.device)
        width = min(self.candidates, vocab)
        plain, narrow, wide = [], [], []
        for i, r in enumerate(rows):
            if not _filtered(r.params, vocab):
                plain.append(i)
            elif width < vocab and not width < r.params.top_k < vocab:
                narrow.append(i)
            else:
                wide.append(i)
        if plain:
            probs = torch.softmax(_take(x, plain), dim=-1)
            out[_index(plain, x)] = self._race(probs, [rows[i].generator for i in plain])
        if narrow:
            tokens, fits = self._filter_and_race(_take(x, narrow), [rows[i] for i in narrow], width)
            done = [i for i, ok in zip(narrow, fits, strict=True) if ok]
            if done:
                out[_index(done, x)] = tokens
            wide += [i for i, ok in zip(narrow, fits, strict=True) if not ok]
        if wide:
            tokens, _ = self._filter_and_race(_take(x, wide), [rows[i] for i in wide], vocab)
            out[_index(wide, x)] = tokens
        return out

    def _filter_and_race(
        self, x: torch.Tensor, rows: list[SamplingRow], width: int
    ) -> tuple[torch.Tensor, list[bool]]:
        """Steps 7-10 within each row's `width` best logits. Returns the tokens of the rows whose
        kept set fits in that window, and which rows fit; the others have drawn no noise."""
        vocab = x.shape[1]
        # Best first. A full sort is faster than topk of the whole width.
        vals, ids = x.sort(dim=-1, descending=True) if width == vocab else x.topk(width, dim=-1)
        keep, fits = _keep_mask(x, vals, ids, [r.params for r in rows])
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        if width == vocab:
            # Back to token-id order, so these rows race exactly like unfiltered ones.
            dense = torch.zeros_like(x).scatter_(1, ids, probs)
            return self._race(dense, [r.generator for r in rows]), [True] * len(rows)
        fit_list = fits.tolist()
        sel = [i for i, ok in enumerate(fit_list) if ok]
        if not sel:
            return torch.empty(0, dtype=torch.int64, device=x.device), fit_list
        keep, probs, ids = _take(keep, sel), _take(probs, sel), _take(ids, sel)
        # Kept tokens first, in token-id order: the noise a seeded row draws then does not depend
        # on how topk happened to order tied logits.
        order = torch.where(keep, ids, ids + vocab).argsort(dim=-1)
        probs, ids = probs.gather(1, order), ids.gather(1, order)
        counts = keep.sum(dim=-1).tolist()
        pick = self._race(probs, [rows[i].generator for i in sel], counts)
        return ids.gather(1, pick.unsqueeze(1)).squeeze(1), fit_list

    def _race(
        self,
        probs: torch.Tensor,
        generators: list[torch.Generator | None],
        counts: list[int] | None = None,
    ) -> torch.Tensor:
        """Column of argmax(p / E) per row, E ~ Exp(1); a seeded row draws counts[i] values (all
        columns when counts is None) from its own generator, so its draw depends on it alone."""
        noise = torch.empty_like(probs)
        shared = [i for i, g in enumerate(generators) if g is None]
        if len(shared) == len(generators):
            noise.exponential_(generator=self.generator)
        elif shared:
            block = torch.empty((len(shared), probs.shape[1]), device=probs.device)
            noise[_index(shared, probs)] = block.exponential_(generator=self.generator)
        for i, g in enumerate(generators):
            if g is not None:
                n = probs.shape[1] if counts is None else counts[i]
                noise[i, :n].exponential_(generator=g)
                noise[i, n:] = 1.0  # columns past the kept tokens hold p = 0
        score = torch.div(probs, noise, out=noise)
        pick = score.argmax(dim=-1)
        # E can be 0 in float32; 0 / 0 is NaN and argmax prefers NaN, which would pick a token
        # of probability 0. Vanishingly rare, so fix the affected rows after the fact.
        bad = score.gather(1, pick.unsqueeze(1)).squeeze(1).isnan()
        if bool(bad.any()):
            pick[bad] = score[bad].nan_to_num(nan=0.0).argmax(dim=-1)
        return pick


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


def _filtered(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def _keep_mask(
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
            full = torch.softmax(_take(x, whole), dim=-1).gather(1, _take(ids, whole))
            if len(whole) == rows:
                probs = full
            else:
                probs[_index(whole, x)] = full
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


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for float32 rows; on CPU by inferd's C kernel where it is built
    (cpu_kernels/argmax.c: rows in parallel, vectorised; PyTorch's is one scalar loop)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        from inferd.cpu_kernels import kernel_library, kernels_available

        if kernels_available():
            x = x.contiguous()
            out = torch.empty(x.shape[0], dtype=torch.int64)
            kernel_library().inferd_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1],
                                                out.data_ptr())  # fmt: skip
            return out
    return x.argmax(dim=-1)


def _take(x: torch.Tensor, index: list[int]) -> torch.Tensor:
    """Rows `index` of x, without a copy when that is all of them in order."""
    if index == list(range(x.shape[0])):
        return x
    return x.index_select(0, _index(index, x))


def _index(index: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(index, dtype=torch.int64, device=like.device)
