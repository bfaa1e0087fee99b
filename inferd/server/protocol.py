"""Request bodies of the HTTP API (pydantic) and their translation to `SamplingParams`.

pydantic checks types only; ranges are checked once, by `SamplingParams`, whose messages name
the parameter, the value and the allowed range. Field names follow the OpenAI API, plus vLLM's
sampling extras (`top_k`, `min_p`, `repetition_penalty`, ...), so clients of either work.
Types are strict (no `true` for a number, no "0.5" for a float): a client that sends the wrong
type has a bug worth a 400. Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferd.errors import InvalidRequest
from inferd.sampling_params import SamplingParams

TokenIds = list[int]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(Body):
    include_usage: bool = False


class SamplingFields(Body):
    """The sampling knobs shared by every generation route (vLLM's names and defaults)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    user: str | None = None
    # vLLM's: mixed into the prefix-cache hashes, so only requests with the same salt share
    # cached blocks (tenants cannot time each other's prompts). Not a sampling parameter.
    cache_salt: str | None = None

    def sampling_kwargs(self) -> dict[str, Any]:
        """Fields the client set, under SamplingParams' names (None keeps the default)."""
        names = (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "n",
            "seed",
            "stop",
            "stop_token_ids",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "logit_bias",
            "min_tokens",
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
        )
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | TokenIds]:
        """The prompt(s) as a list: one entry per choice group."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequest("prompt", "prompt must not be an empty list")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # one prompt given as token ids
        return list(p)

    def sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise InvalidRequest("suffix", "suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequest(
                "best_of", f"best_of must equal n ({self.n}) if given, got {self.best_of}"
            )
        kwargs = self.sampling_kwargs()
        kwargs["max_tokens"] = self.max_tokens
        if self.logprobs is not None:
            kwargs["logprobs"] = self.logprobs
            if self.echo:  # echoed prompt tokens carry logprobs too
                kwargs["prompt_logprobs"] = self.logprobs
        return SamplingParams(**kwargs)


class ContentPart(Body):
    model_config = ConfigDict(strict=True, extra="allow")

    type: str
    text: str | None = None


class ChatMessage(Body):
    model_config = ConfigDict(
        strict=True, extra="allow"
    )  # name, tool_calls, ...: the template decides

    role: str
    content: str | list[ContentPart] | None = None

    def to_template(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            for part in self.content:
                if part.type != "text":
                    raise InvalidRequest(
                        "messages",
                        f"content parts of type {part.type!r} are not supported (only 'text')",
                    )
            message["content"] = [p.model_dump(exclude_none=True) for p in self.content]
        elif self.content is None:
            message["content"] = ""
        return message


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def template_messages(self) -> list[dict[str, Any]]:
        if not self.messages:
            raise InvalidRequest("messages", "messages must contain at least one message")
        return [m.to_template() for m in self.messages]

    def sampling_params(self) -> SamplingParams:
        kwargs = self.sampling_kwargs()
        limit = self.max_completion_tokens
        if limit is not None and limit < 1:
            raise InvalidRequest(
                "max_completion_tokens",
                f"max_completion_tokens must be an integer >= 1, got {limit}",
            )
        # None: up to the context length, like vLLM (the engine resolves it per prompt).
        kwargs["max_tokens"] = limit if limit is not None else self.max_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs", "top_logprobs requires logprobs to be true")
        if self.logprobs:
            kwargs["logprobs"] = self.top_logprobs or 0
        return SamplingParams(**kwargs)


class GenerateRequest(SamplingFields):
    """The simple endpoint: one prompt (text or token ids) → text, counts and timings."""

    prompt: str | TokenIds
    max_tokens: int | None = 16
    n: int = Field(default=1, ge=1, le=1)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.sampling_kwargs(), max_tokens=self.max_tokens)


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages
    add_generation_prompt: bool = True


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: TokenIds
