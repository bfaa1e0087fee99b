"""llama.cpp's `infill` sampler (fill-in-the-middle): a filter on a row's candidates after top-k,
top-p and min-p (sampler.py's steps 7-9), before the draw. Code-completion plugins (llama.vim,
llama.vscode) put it last in their chain (`["top_k", "top_p", "infill"]`); a request asks for it
with `SamplingParams.infill_sampler`.

What it does to the candidates (their probabilities renormalised over the kept set):

1. End of generation when it is likely enough: if the end-of-generation (EOG) tokens' total
   probability, times 3 × the number of candidates, beats the other tokens' total, only the EOG
   tokens are kept. (llama.cpp's code weighs the EOG mass by 3 × n; its header's comment says
   n.) The EOG tokens of a row are the engine's EOS ids and the request's stop_token_ids (/infill
   adds the model's FIM pad / repo / file-separator tokens there, as llama.cpp counts them EOG).
2. Otherwise candidates whose text is a prefix of another's are merged: the less likely of the
   pair gives its probability to the likelier one and leaves ("hel" 0.5, "hello" 0.1 → "hel"
   0.6). Pairs are visited as llama.cpp visits them: for each candidate, most likely first (ties:
   lower token id first), each of its extensions in the same order; a candidate that has left
   takes part in nothing more. Tokens without text (special tokens) and EOG tokens are never
   merged. A token's text is its bytes, from the grammar engine's vocabulary (TokenPieces).
3. Non-EOG candidates below probability 0.2 are dropped. If no non-EOG candidate is left, the
   generation ends: the row's end token (its first EOS id) is the only candidate.
4. Renormalised, the non-EOG candidates below 1 / (non-EOG left + 1) are dropped.
5. The draw among the candidates left follows their own probabilities, renormalised: the
   merged sums decide only which stay (llama.cpp's last sampler, `dist`, computes the
   probabilities again from the logits, which the merges leave as they were).

The work is per row and on at most `INFILL_MAX_CANDIDATES` candidates (SamplingParams requires a
top_k that small: without one every token of the vocabulary would be a candidate), in plain
Python on the row's own values, so a row's result depends on its own logits alone: a seeded
request gets the same tokens alone and in a batch.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from inferd.engine.sampling.filters import keep_mask, take_rows
from inferd.engine.sampling.sampling_row import SamplingRow

log = logging.getLogger(__name__)

EOG_WEIGHT = 3.0  # step 1: the EOG mass counts this many times the number of candidates
MIN_PROB = 0.2  # step 3's threshold


class TokenPieces:
    """Each token's text as bytes (b"" for special tokens), read from the vocabulary the
    grammar engine already builds for structured outputs (inferd/structured/tokenizer_info.py):
    one vocabulary per engine, built once (in a worker thread: `warm`), never shipped per step.
    `info` builds (or returns) that TokenizerInfo."""

    def __init__(self, info: Callable[[], Any]):
        self._info = info
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._cache: dict[int, bytes] = {}

    def warm(self) -> None:
        """Build the vocabulary in a background thread now (a model with FIM tokens will be
        asked for it), so no step waits for it."""
        threading.Thread(target=self._load, name="inferd-infill-vocab", daemon=True).start()

    def _load(self) -> Any:
        with self._lock:
            if self._tokenizer is None and self._error is None:
                try:
                    self._tokenizer = self._info().ll_tokenizer
                except Exception as e:  # noqa: BLE001 - reported once, merging is then skipped
                    self._error = e
                    log.warning("the infill sampler cannot read token texts (%s): candidates "
                                "are not merged by prefix", e)  # fmt: skip
            return self._tokenizer

    def available(self) -> bool:
        return self._load() is not None

    def piece(self, token: int) -> bytes:
        cached = self._cache.get(token)
        if cached is not None:
            return cached
        tokenizer = self._load()
        text = b""
        if tokenizer is not None and 0 <= token < tokenizer.vocab_size:
            if not tokenizer.is_special_token(token):
                text = tokenizer.decode_bytes([token])
        self._cache[token] = text
        return text


def infill_filter(
    candidates: list[tuple[int, float]],
    eog: set[int] | frozenset[int],
    piece: Callable[[int], bytes] | None,
    end_token: int | None,
) -> list[tuple[int, float]]:
    """The module's steps 1-5 on (token id, probability) pairs; returns the kept pairs, each
    with its own probability renormalised over the kept ones (step 5). `piece`: a token's text
    (None: no merging)."""
    ordered = sorted(candidates, key=lambda c: (-c[1], c[0]))
    ids = [t for t, _ in ordered]
    probs = [p for _, p in ordered]
    own = dict(ordered)
    is_eog = [t in eog for t in ids]
    eog_mass = sum(p for p, e in zip(probs, is_eog, strict=True) if e)
    if EOG_WEIGHT * eog_mass * len(ids) > sum(probs) - eog_mass:
        return _normalised([(t, p) for t, p, e in zip(ids, probs, is_eog, strict=True) if e])
    alive = [True] * len(ids)
    if piece is not None:
        texts = [b"" if e else piece(t) for t, e in zip(ids, is_eog, strict=True)]
        _merge_prefixes(texts, probs, alive)
    kept = [(t, p, e) for t, p, e, a in zip(ids, probs, is_eog, alive, strict=True)
            if a and (e or p >= MIN_PROB)]  # fmt: skip
    texts_left = sum(1 for _, _, e in kept if not e)
    if texts_left == 0:
        return [(end_token, 1.0)] if end_token is not None else [(ids[0], 1.0)]
    total = sum(p for _, p, _ in kept)
    floor = 1.0 / (texts_left + 1)
    return _normalised([(t, own[t]) for t, p, e in kept if e or p / total >= floor])


def _merge_prefixes(texts: list[bytes], probs: list[float], alive: list[bool]) -> None:
    """Step 2 in place: candidate i (most likely first) against each candidate whose text
    starts with i's, in the same order; the less likely one (ties: i keeps it) is merged into
    the other and leaves. Extensions are found in the texts' sorted order, where all the texts
    starting with a given one are adjacent."""
    by_text = sorted((t, i) for i, t in enumerate(texts) if t)
    keys = [t for t, _ in by_text]
    for i, text in enumerate(texts):
        if not text:
            continue
        extensions = []
        k = bisect.bisect_left(keys, text)
        while k < len(keys) and keys[k].startswith(text):
            if by_text[k][1] != i:
                extensions.append(by_text[k][1])
            k += 1
        for j in sorted(extensions):
            if not alive[i]:
                break
            if not alive[j]:
                continue
            into, out = (j, i) if probs[j] > probs[i] else (i, j)
            probs[into] += probs[out]
            probs[out] = 0.0
            alive[out] = False


def _normalised(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    total = sum(p for _, p in pairs)
    return [(t, p / total) for t, p in pairs]


def infill_candidates(
    x: torch.Tensor, rows: list[SamplingRow], width: int, pieces: TokenPieces | None
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Rows of `x` (temperature applied) through top-k / top-p / min-p and the infill filter:
    (probabilities [R, W], their token ids [R, W], kept columns per row), each row's kept
    tokens first in token-id order (sampler.py's race draws one noise value per kept token, in
    that order, so a seeded row's draw depends on nothing else)."""
    vocab = x.shape[1]
    width = min(width, vocab)
    vals, ids = x.topk(width, dim=-1)
    keep, fits = keep_mask(x, vals, ids, [r.params for r in rows])
    # NOTE: the rest is per row in plain Python: one copy of the windows to the host, not a
    # device synchronisation per row.
    window = {i: (v, t, k) for i, (v, t, k) in enumerate(zip(vals.cpu(), ids.cpu(), keep.cpu()))}
    wide = [i for i, ok in enumerate(fits.tolist()) if not ok]
    if wide:  # ties past the window: the whole row, sorted (as the sampler's wide rows)
        part = take_rows(x, wide)
        w_vals, w_ids = part.sort(dim=-1, descending=True)
        w_keep, _ = keep_mask(part, w_vals, w_ids, [rows[i].params for i in wide])
        for i, v, t, k in zip(wide, w_vals.cpu(), w_ids.cpu(), w_keep.cpu(), strict=True):
            window[i] = (v, t, k)
    merge = pieces.piece if pieces is not None and pieces.available() else None
    kept_rows: list[list[tuple[int, float]]] = []
    for i, row in enumerate(rows):
        row_vals, row_ids, row_keep = window[i]
        probs = torch.softmax(row_vals[row_keep], dim=0).tolist()  # NOTE: this row's alone
        candidates = list(zip(row_ids[row_keep].tolist(), probs, strict=True))
        eog = frozenset(row.eos_token_ids) | frozenset(row.params.stop_token_ids)
        stops = row.params.stop_token_ids
        end = row.eos_token_ids[0] if row.eos_token_ids else (stops[0] if stops else None)
        kept_rows.append(sorted(infill_filter(candidates, eog, merge, end)))
    counts = [len(k) for k in kept_rows]
    out_probs = torch.zeros((len(rows), max(counts)), dtype=torch.float32)
    out_ids = torch.zeros((len(rows), max(counts)), dtype=torch.int64)
    for i, kept in enumerate(kept_rows):
        out_ids[i, : counts[i]] = torch.tensor([t for t, _ in kept], dtype=torch.int64)
        out_probs[i, : counts[i]] = torch.tensor([p for _, p in kept], dtype=torch.float32)
    return out_probs.to(x.device), out_ids.to(x.device), counts
