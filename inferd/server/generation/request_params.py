"""Request bodies → `SamplingParams`: the knobs under their SamplingParams names, the structured
output spec (one of response_format / structured_outputs / guided_*, or the spec a forced tool
call needs), and the route-specific limits (`max_completion_tokens`, `top_logprobs`, ...)."""

from __future__ import annotations

from typing import Any

from inferd.errors import InvalidRequest
from inferd.sampling_params import RequestOutputKind, SamplingParams
from inferd.server.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    GenerationFields,
)
from inferd.structured.request_fields import GUIDED_FIELDS, resolve
from inferd.structured_params import StructuredOutputsParams

SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # a 64-bit signed integer, as vLLM's seed field
_SAMPLING_NAMES = (
    "temperature", "top_p", "top_k", "min_p", "n", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
    "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "allowed_token_ids",
    "truncate_prompt_tokens",
)  # fmt: skip


def structured_spec(body: GenerationFields) -> StructuredOutputsParams | None:
    """The structured-output spec the body asks for, or None (InvalidRequest naming the field
    when it is malformed or asked for twice)."""
    return resolve(
        response_format=body.response_format,
        structured_outputs=body.structured_outputs,
        guided={name: getattr(body, name) for name in GUIDED_FIELDS},
    )


def _common(body: GenerationFields, forced: StructuredOutputsParams | None) -> dict[str, Any]:
    body.unsupported_values()
    if body.seed is not None and not SEED_RANGE[0] <= body.seed <= SEED_RANGE[1]:
        raise InvalidRequest(
            "seed", f"seed must be a 64-bit integer in [-2**63, 2**63 - 1], got {body.seed}"
        )
    kwargs = {k: getattr(body, k) for k in _SAMPLING_NAMES if getattr(body, k) is not None}
    spec = structured_spec(body)
    if forced is not None:
        if spec is not None:
            raise InvalidRequest(
                "tool_choice",
                f"tool_choice forces a tool call, which cannot be combined with "
                f"{spec.field_name()}: ask for one or the other",
            )
        spec = forced
    if spec is not None:
        kwargs["structured_outputs"] = spec
    if getattr(body, "stream_options", None) is not None and not getattr(body, "stream", False):
        raise InvalidRequest("stream_options", "stream_options is only allowed with stream: true")
    if getattr(body, "stream", False):  # a stream sends each step's news: only those are built
        kwargs["output_kind"] = RequestOutputKind.DELTA
    return kwargs


def refuse_streamed_prompt_logprobs(stream: bool, prompt_logprobs: int | None) -> None:
    if stream and prompt_logprobs is not None:
        raise InvalidRequest(
            "prompt_logprobs", "prompt_logprobs is not supported with stream: true"
        )


def completion_params(body: CompletionRequest) -> SamplingParams:
    kwargs = _common(body, None)
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest(
            "best_of", f"best_of must equal n ({body.n}) if given, got {body.best_of}"
        )
    kwargs["max_tokens"] = body.max_tokens
    if body.logprobs is not None:
        kwargs["logprobs"] = body.logprobs
    if body.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = body.prompt_logprobs
    elif body.echo and body.logprobs is not None:
        kwargs["prompt_logprobs"] = body.logprobs  # echoed prompt tokens carry logprobs too
    return SamplingParams(**kwargs)


def chat_params(
    body: ChatCompletionRequest,
    forced: StructuredOutputsParams | None = None,
    special_tokens: bool = False,
) -> SamplingParams:
    """`forced`: the spec of a forced tool call (tool_choice "required" or a named function).
    `special_tokens`: the reply is decoded with its special tokens, whatever
    skip_special_tokens says: its parser reads them as markers and removes every one (harmony),
    so the reply's fields hold none either way."""
    kwargs = _common(body, forced)
    if special_tokens:
        kwargs["skip_special_tokens"] = False
    limit = body.max_completion_tokens
    if limit is not None and limit < 1:
        raise InvalidRequest(
            "max_completion_tokens", f"max_completion_tokens must be an integer >= 1, got {limit}"
        )
    # None: up to the context length, like vLLM (the engine resolves it per prompt).
    kwargs["max_tokens"] = limit if limit is not None else body.max_tokens
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs", "top_logprobs requires logprobs to be true")
    if body.logprobs:
        kwargs["logprobs"] = body.top_logprobs or 0
    if body.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = body.prompt_logprobs
    return SamplingParams(**kwargs)


def sampling_params(body: GenerationFields, max_tokens: int | None) -> SamplingParams:
    """A route's own body (/infill) with the fields every generation route shares."""
    return SamplingParams(**_common(body, None), max_tokens=max_tokens)


def generate_params(body: GenerateRequest) -> SamplingParams:
    return SamplingParams(**_common(body, None), max_tokens=body.max_tokens)
