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
    Rows with `infill_sampler` then go through llama.cpp's infill filter (infill_sampler.py).
10. draw with the exponential race: argmax(p / E), E ~ Exp(1) independent per token. Rows whose
    request has a seed draw E from their own `generator`, everything else from the sampler's, so a
    seeded request gets the same tokens whatever else is in the batch.

Logprobs (logprobs.py) are those of the raw model distribution, before steps 0-9.

A row under a grammar (structured outputs) carries its bitmask (the step record's); the mask is a
logits processor here (grammar_mask.py): applied before everything above, so such a row's
logprobs are those of the masked distribution (vLLM's rule), or, for a greedy row without
logprobs, checked after the argmax and applied only when the token is refused (the same token).

One pass for a whole step: the rows of a sequence verifying drafts are sampled here with every
other row (row j as if drafts 0..j-1 were output already), and speculative.py's rejection pass
keeps what agrees. A seeded sequence's rows draw in row order from its generator and record the
generator's state after each draw (`keep_generator_state`), so the rejection pass can put the
generator back to where plain decoding would have left it.

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

from dataclasses import dataclass, field

import torch

from inferd.engine.sampling.filters import (
    filtered,
    keep_mask,
    restrict_to_allowed,
    row_index,
    take_rows,
)
from inferd.engine.sampling.grammar_mask import GrammarMasks
from inferd.engine.sampling.infill_sampler import TokenPieces, infill_candidates
from inferd.engine.sampling.logprobs import position_logprobs, prompt_logprobs
from inferd.engine.sampling.penalties import apply_logit_processors
from inferd.engine.sampling.sampling_row import SamplingRow
from inferd.outputs import PositionLogprobs

__all__ = ["SampleResult", "Sampler", "SamplingRow", "make_generator", "prompt_logprobs"]

CANDIDATES = 1024  # logits a filtered row looks at before falling back to a full sort


@dataclass
class SampleResult:
    token_ids: list[int]  # one per row
    # Per row: None unless params.logprobs is set, else {sampled token, then the top
    # params.logprobs alternatives in rank order}.
    logprobs: list[PositionLogprobs | None]
    # Per row with keep_generator_state: its generator's state after its draw (else None).
    generator_states: list[torch.Tensor | None] = field(default_factory=list)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for a seeded request; any Python int is accepted as a seed."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)  # manual_seed takes [0, 2**64) (or small negatives)
    return generator


class Sampler:
    def __init__(
        self,
        seed: int = 0,
        device: torch.device | str = "cpu",
        candidates: int = CANDIDATES,
        grammar: GrammarMasks | None = None,
        pieces: TokenPieces | None = None,
    ):
        self.device = torch.device(device)
        self.pieces = pieces  # token texts for the infill sampler (infill_sampler.py)
        self.generator = make_generator(seed, self.device)  # for rows without a seed
        self.candidates = candidates
        self.grammar = grammar or GrammarMasks()

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"sampler needs one SamplingRow per logits row, got logits of shape "
                f"{tuple(logits.shape)} and {len(rows)} rows"
            )
        # NOTE: `raw` may be the caller's tensor; it is only read, every change goes to a copy.
        raw = logits.float()
        checked, masked = self.grammar.split(rows)
        if masked:
            raw = raw.clone() if raw is logits else raw
            self.grammar.apply(raw, rows, masked)  # logprobs see the masked distribution too
        x = restrict_to_allowed(apply_logit_processors(raw, rows), raw, rows)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        drawn = [i for i, r in enumerate(rows) if not r.params.greedy]
        states: list[torch.Tensor | None] = [None] * len(rows)
        if not drawn:  # all greedy: the argmax is the answer, no scatter into place
            tokens = argmax_rows(x)
        else:
            tokens = torch.empty(len(rows), dtype=torch.int64, device=x.device)
        if greedy and drawn:
            tokens[row_index(greedy, x)] = argmax_rows(take_rows(x, greedy))
        if drawn:
            tokens[row_index(drawn, x)], drawn_states = self._draw(
                take_rows(x, drawn), [rows[i] for i in drawn]
            )
            for i, state in zip(drawn, drawn_states, strict=True):
                states[i] = state
        token_ids = tokens.tolist()
        if checked:  # greedy rows: the masked argmax is the argmax whenever that is allowed
            self.grammar.check(x, rows, checked, token_ids)

        logprobs: list[PositionLogprobs | None] = [None] * len(rows)
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if wanted:
            found = position_logprobs(
                take_rows(raw, wanted),
                [token_ids[i] for i in wanted],
                [rows[i].params.logprobs for i in wanted],
            )
            for i, entry in zip(wanted, found, strict=True):
                logprobs[i] = entry
        return SampleResult(token_ids, logprobs, states)

    def _draw(
        self, x: torch.Tensor, rows: list[SamplingRow]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Token ids for rows that sample (steps 6-10), and generator states (see the module
        docstring). Each row's candidates first, then the noise, seeded rows in row order."""
        vocab = x.shape[1]
        temperature = torch.tensor([r.params.temperature for r in rows], device=x.device)
        x = x / temperature.unsqueeze(1)
        width = min(self.candidates, vocab)
        plain, narrow, wide, infill = [], [], [], []
        for i, r in enumerate(rows):
            if r.params.infill_sampler:
                infill.append(i)
            elif not filtered(r.params, vocab):
                plain.append(i)
            elif width < vocab and not width < r.params.top_k < vocab:
                narrow.append(i)
            else:
                wide.append(i)
        pools: list[_Pool] = []
        if plain:
            pools.append(_Pool(plain, torch.softmax(take_rows(x, plain), dim=-1)))
        if narrow:
            pool, unfit = self._narrow(take_rows(x, narrow), [rows[i] for i in narrow], width)
            if pool is not None:
                pool.rows = [narrow[j] for j in pool.rows]
                pools.append(pool)
            wide += [narrow[j] for j in unfit]
        if wide:
            pools.append(self._wide(take_rows(x, wide), [rows[i] for i in wide], wide))
        if infill:  # steps 7-9, then llama.cpp's infill filter (infill_sampler.py)
            probs, ids, counts = infill_candidates(
                take_rows(x, infill), [rows[i] for i in infill], width, self.pieces
            )
            pools.append(_Pool(infill, probs, ids, counts))
        states = self._noise(pools, rows)
        out = torch.empty(len(rows), dtype=torch.int64, device=x.device)
        for pool in pools:
            out[row_index(pool.rows, x)] = pool.race()
        return out, states

    def _noise(self, pools: list[_Pool], rows: list[SamplingRow]) -> list[torch.Tensor | None]:
        """E ~ Exp(1) for every candidate of every pool. A seeded row draws counts[i] values
        (every column without counts) from its own generator, so its draw depends on it alone.
        NOTE: seeded rows draw in row order whatever their pool: the rows of a sequence that
        verifies drafts share one generator, which must be used as plain decoding would."""
        states: list[torch.Tensor | None] = [None] * len(rows)
        where = {}
        for k, pool in enumerate(pools):
            pool.noise = torch.empty_like(pool.probs)
            shared = [p for p, i in enumerate(pool.rows) if rows[i].generator is None]
            if len(shared) == len(pool.rows):
                pool.noise.exponential_(generator=self.generator)
            elif shared:
                block = torch.empty((len(shared), pool.probs.shape[1]), device=pool.probs.device)
                pool.noise[row_index(shared, block)] = block.exponential_(generator=self.generator)
            where.update({i: (k, p) for p, i in enumerate(pool.rows)})
        for i in sorted(where):
            g = rows[i].generator
            if g is None:
                continue
            k, p = where[i]
            pool = pools[k]
            n = pool.probs.shape[1] if pool.counts is None else pool.counts[p]
            pool.noise[p, :n].exponential_(generator=g)
            pool.noise[p, n:] = 1.0  # columns past the kept tokens hold p = 0
            if rows[i].keep_generator_state:
                states[i] = g.get_state()
        return states

    def _narrow(
        self, x: torch.Tensor, rows: list[SamplingRow], width: int
    ) -> tuple[_Pool | None, list[int]]:
        """Steps 7-9 within each row's `width` best logits: a pool of the rows whose kept set
        fits in that window (kept tokens first, in token-id order, so the noise a seeded row
        draws does not depend on how topk ordered tied logits), and the rows that do not fit."""
        vocab = x.shape[1]
        vals, ids = x.topk(width, dim=-1)
        keep, fits = keep_mask(x, vals, ids, [r.params for r in rows])
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        fit_list = fits.tolist()
        sel = [i for i, ok in enumerate(fit_list) if ok]
        unfit = [i for i, ok in enumerate(fit_list) if not ok]
        if not sel:
            return None, unfit
        keep, probs, ids = take_rows(keep, sel), take_rows(probs, sel), take_rows(ids, sel)
        order = torch.where(keep, ids, ids + vocab).argsort(dim=-1)
        probs, ids = probs.gather(1, order), ids.gather(1, order)
        return _Pool(sel, probs, ids, keep.sum(dim=-1).tolist()), unfit

    def _wide(self, x: torch.Tensor, rows: list[SamplingRow], index: list[int]) -> _Pool:
        """Steps 7-9 over the whole vocabulary (a full sort is faster than topk of all of it),
        back in token-id order, so these rows race exactly like unfiltered ones."""
        vals, ids = x.sort(dim=-1, descending=True)
        keep, _ = keep_mask(x, vals, ids, [r.params for r in rows])
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        return _Pool(index, torch.zeros_like(x).scatter_(1, ids, probs))


@dataclass
class _Pool:
    """Rows racing over the same kind of candidates: `probs` [R, W] in token-id order (`ids`:
    the token of each column, None when column = token id), `counts`: kept columns per row."""

    rows: list[int]
    probs: torch.Tensor
    ids: torch.Tensor | None = None
    counts: list[int] | None = None
    noise: torch.Tensor | None = None

    def race(self) -> torch.Tensor:
        """argmax(p / E) per row: the exponential race draws each token with probability p."""
        score = torch.div(self.probs, self.noise, out=self.noise)
        pick = score.argmax(dim=-1)
        # E can be 0 in float32; 0 / 0 is NaN and argmax prefers NaN, which would pick a token
        # of probability 0. Vanishingly rare, so fix the affected rows after the fact.
        bad = score.gather(1, pick.unsqueeze(1)).squeeze(1).isnan()
        if bool(bad.any()):
            pick[bad] = score[bad].nan_to_num(nan=0.0).argmax(dim=-1)
        if self.ids is None:
            return pick
        return self.ids.gather(1, pick.unsqueeze(1)).squeeze(1)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for float32 rows; on CPU by inferd's C kernel where it is built
    (cpu_kernels/argmax.c: rows in parallel, vectorised; PyTorch's is one scalar loop)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        from inferd.cpu_kernels import KernelsUnavailable, kernel_library

        try:
            lib = kernel_library()
        except KernelsUnavailable:
            return x.argmax(dim=-1)
        x = x.contiguous()
        out = torch.empty(x.shape[0], dtype=torch.int64)
        lib.inferd_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
        return out
    return x.argmax(dim=-1)
