"""What a caller sees of a request: its `RequestOutput`, cumulative (all text and tokens so far)."""

from __future__ import annotations

from inferd.engine.request import Request
from inferd.engine.stopping import streamable_text_end
from inferd.outputs import CompletionOutput, RequestOutput


def request_output(req: Request) -> RequestOutput:
    completions = []
    for seq in req.sequences:
        end = streamable_text_end(seq)
        completions.append(
            CompletionOutput(
                index=seq.sample_index,
                text=seq.text[:end],
                token_ids=seq.output_token_ids,
                cumulative_logprob=seq.cumulative_logprob if seq.logprobs else None,
                logprobs=list(seq.logprobs) if req.params.logprobs is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
        )
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=completions,
        finished=req.finished,
        prompt_logprobs=req.prompt_logprobs,
        metrics=req.metrics,
        num_cached_tokens=req.metrics.num_cached_tokens,
        error=req.error,
    )
