"""BPE merges recovered from a vocabulary (GGUF "llama" vocabularies store none), and the
merges that can never fire dropped, so the tokenizer loads faster with the same encodings."""

from __future__ import annotations

from collections.abc import Sequence


def derive_merges(tokens: Sequence[str], scores: Sequence[float] | None = None) -> list[tuple]:
    """Every (left, right) pair of tokens whose concatenation is a token, best first.

    Ranks follow HF's rule: by the merged token's score (higher first; `None` means "earlier in
    the list is better"), then longer left part, then longer right part, then the order of the
    tokens. A token appearing twice counts once, with its last index (dict semantics).
    """
    vocab = {token: index for index, token in enumerate(tokens)}
    merges: list[tuple] = []
    append = merges.append
    if scores is None and len(vocab) == len(tokens):
        # NOTE: the common case (Gemma). Walking tokens in order and cut points from the right
        # already yields the final order, so no sort over half a million pairs is needed.
        for token in tokens:
            for cut in range(len(token) - 1, 0, -1):
                left = token[:cut]
                if left in vocab:
                    right = token[cut:]
                    if right in vocab:
                        append((left, right))
        return merges
    if scores is None:
        scores = [-index for index in range(len(tokens))]
    best: dict[str, float] = {}
    for token, score in zip(tokens, scores, strict=True):
        best[token] = float(score)  # first position, last value: as a dict update does
    keyed = []
    for order, (token, score) in enumerate(best.items()):
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                keyed.append((-score, -cut, cut - len(token), order, left, right))
    keyed.sort()
    return [(left, right) for *_, left, right in keyed]


def prune_dead_merges(
    merges: list[tuple], vocab: dict[str, int], byte_fallback: bool
) -> list[tuple]:
    """`merges` without the ones BPE can never apply; encoding is unchanged.

    NOTE: why this is exact. A merge producing token t can only fire on a span of text equal
    to t, split exactly into its two parts. Up to that moment no merge crossed the span's ends,
    so the merges inside the span ran in the same order as they do when BPE runs on t alone.
    Hence BPE on t alone, stopped at two symbols, names the only merge for t that can ever
    fire (or none). Relative ranks are kept, so the survivors behave as before. For Gemma this
    drops 515k merges to 236k, and merges are most of the cost of loading the tokenizer.
    """
    rank = {pair: index for index, pair in enumerate(merges)}
    splits: dict[str, int] = {}
    for left, right in merges:
        splits[left + right] = splits.get(left + right, 0) + 1
    live: dict[str, tuple | None] = {}
    for token, count in splits.items():
        if count > 1:
            symbols = _initial_symbols(token, vocab, byte_fallback)
            if symbols is not None:  # else keep every split of this token
                live[token] = _last_pair(symbols, rank)
    return [pair for pair in merges if live.get(pair[0] + pair[1], pair) == pair]


def _initial_symbols(text: str, vocab: dict[str, int], byte_fallback: bool) -> list[str] | None:
    """The symbols BPE starts from: characters, or their <0xNN> tokens under byte fallback;
    None when some character would become <unk> (not simulated)."""
    symbols = []
    for char in text:
        if char in vocab:
            symbols.append(char)
            continue
        pieces = [f"<0x{b:02X}>" for b in char.encode("utf-8")] if byte_fallback else []
        if not pieces or any(p not in vocab for p in pieces):
            return None
        symbols.extend(pieces)
    return symbols


def _last_pair(symbols: list[str], rank: dict[tuple, int]) -> tuple | None:
    """Run BPE (lowest rank first, leftmost on ties, as `tokenizers` does) until two symbols
    remain; None when it gets stuck earlier."""
    get, stuck = rank.get, len(rank)
    ranks = [get(pair, stuck) for pair in zip(symbols, symbols[1:], strict=False)]  # (i, i+1)
    while len(symbols) > 2:
        best = min(ranks)
        if best == stuck:
            return None
        at = ranks.index(best)
        merged = symbols[at] + symbols[at + 1]
        symbols[at : at + 2] = [merged]
        del ranks[at]
        if at < len(ranks):
            ranks[at] = get((merged, symbols[at + 1]), stuck)
        if at > 0:
            ranks[at - 1] = get((symbols[at - 1], merged), stuck)
    return tuple(symbols) if len(symbols) == 2 else None
