"""Deciding when a sequence ends, and turning its tokens into text as they arrive (the scheduler
calls `append_token` for every sampled token).

Stop strings can straddle token boundaries, so they are searched in the detokenized text, not in
token ids: after each token only the tail that could contain a new match is scanned. While a
sequence runs, the last `longest stop string - 1` characters are held back from streaming, since
they may still turn out to begin a stop string that must not appear in the output.
"""

from __future__ import annotations

from inferd.engine.request import Sequence


def append_token(seq: Sequence, token: int, eos_ids: tuple[int, ...], max_tokens: int,
                 max_model_len: int) -> None:  # fmt: skip
    """Append a sampled token, extend the text, and set `finish_reason` if the sequence ends."""
    params = seq.request.params
    seq.token_ids.append(token)
    n_out = seq.num_output_tokens
    # The sampler kept EOS / stop tokens out while fewer than min_tokens had been generated.
    can_stop = n_out > params.min_tokens
    if can_stop and not params.ignore_eos and token in eos_ids:
        seq.finish_reason, seq.stop_reason = "stop", None
        return
    if can_stop and params.stop_token_ids and token in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token
        return
    before = len(seq.text)
    _extend_text(seq, [token])
    if params.stop and n_out >= params.min_tokens and _check_stop_strings(seq, before):
        return
    if n_out >= max_tokens or seq.num_tokens >= max_model_len:
        seq.finish_reason = "length"
        _flush_text(seq)


def _extend_text(seq: Sequence, tokens: list[int]) -> str:
    if seq.detokenizer is None:
        return ""
    delta = seq.detokenizer.step(tokens)
    seq.text += delta
    return delta


def _flush_text(seq: Sequence) -> None:
    """At a length limit, emit what the detokenizer still holds (an incomplete character at the
    very end). A stop token ends the text where it is: the held bytes never became text."""
    if seq.detokenizer is not None:
        seq.text += seq.detokenizer.flush()


def _check_stop_strings(seq: Sequence, before: int) -> bool:
    params = seq.request.params
    longest = max(len(s) for s in params.stop)
    # Only a match ending in the newly arrived text is new.
    start = max(0, before - longest + 1)
    best = None
    for stop in params.stop:
        i = seq.text.find(stop, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, stop)
    if best is None:
        return False
    i, stop = best
    seq.text = seq.text[: i + len(stop)] if params.include_stop_str_in_output else seq.text[:i]
    seq.finish_reason, seq.stop_reason = "stop", stop
    return True


def streamable_text_end(seq: Sequence) -> int:
    """How much of `seq.text` may be sent to a client now."""
    params = seq.request.params
    if seq.finish_reason is not None or not params.stop:
        return len(seq.text)
    # NOTE: a stop string completed later starts at or after this point (it would otherwise
    # have been found already), so the text shown so far never has to be taken back.
    hold = max(len(s) for s in params.stop) - 1
    return max(0, len(seq.text) - hold)
