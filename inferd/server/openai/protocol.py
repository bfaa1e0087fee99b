"""Request bodies of the HTTP API (pydantic): every field a route accepts, and nothing else.

Field names follow the OpenAI API plus vLLM's extras, so clients of either work. Every field
declared here is honoured (docs/server.md lists what each does); a field that is not declared is
refused with `400 unsupported parameter: NAME`, so nothing a client sends is silently ignored.
A few fields are declared only so that their no-op value (`use_beam_search: false`,
`store: false`, ...) passes: any other value is refused the same way (`unsupported_values`).

pydantic checks types only (strictly: no `true` for a number, no "0.5" for a float); ranges are
checked once, by `SamplingParams` (sampling_params.py), whose messages name the parameter, the
value and the allowed range. The translation to SamplingParams is in request_params.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferd.errors import InvalidRequest

TokenIds = list[int]


class Body(BaseModel):
    # NOTE: extra="forbid" is what turns an unknown field into "unsupported parameter: NAME"
    # (inferd/server/http/errors.py words pydantic's `extra_forbidden` errors that way).
    model_config = ConfigDict(strict=True, extra="forbid")

    def unsupported_values(self) -> None:
        """Refuse the declared fields whose value this server cannot honour."""
        for name, allowed in NO_OP_VALUES.items():
            if name not in type(self).model_fields:
                continue
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise InvalidRequest(
                    name,
                    f"unsupported parameter: {name}={value!r} (only "
                    f"{' or '.join(repr(a) for a in allowed)} is supported)",
                )


# Fields accepted only with these values (the behaviour the server always has).
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (False,),
    "length_penalty": (1.0, 1),
    "spaces_between_special_tokens": (True,),
    "store": (False,),
    "modalities": (["text"],),
    "guided_decoding_backend": ("auto", "llguidance", "guidance"),
}


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk, with include_usage

    @property
    def usage_in_every_chunk(self) -> bool:
        # NOTE: vLLM's rule: continuous_usage_stats adds to include_usage, it never turns
        # usage on by itself (a client that said include_usage: false gets none).
        return self.include_usage and self.continuous_usage_stats


class GenerationFields(Body):
    """What every generation route takes: sampling (vLLM's names and defaults), structured
    outputs, and the vLLM extras that act on the prompt or the sampled tokens."""

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
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    # Structured outputs, three ways (inferd/structured/request_fields.py).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    # The end user, for the operator's logs (OpenAI's `user`, and its successor).
    user: str | None = None
    safety_identifier: str | None = None
    # vLLM's: mixed into the prefix-cache hashes, so only requests with the same salt share
    # cached blocks (tenants cannot time each other's prompts). Not a sampling parameter.
    cache_salt: str | None = Field(default=None, min_length=1)
    # inferd's extension (vLLM style): the request's own timeline in the response
    # (server/metrics/timeline.py), on servers started with --enable-request-timeline.
    return_timeline: bool = False
    # vLLM's: lower is admitted first under --scheduling-policy priority, and may preempt a
    # running request of a higher value; under fcfs only 0 is accepted (the engine says so).
    priority: int | None = None
    # No-op values only (NO_OP_VALUES).
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    spaces_between_special_tokens: bool | None = None


class OpenAIFields(GenerationFields):
    """Fields of both OpenAI routes (completions and chat)."""

    stream: bool = False
    stream_options: StreamOptions | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    add_special_tokens: bool | None = None  # completions: default True; chat: default False


class CompletionRequest(OpenAIFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16
    logprobs: int | None = None
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


class ContentPart(Body):
    model_config = ConfigDict(strict=True, extra="allow")  # the part's type decides

    type: str
    text: str | None = None


class ChatMessage(Body):
    # name, tool_calls, tool_call_id, ...: passed to the chat template, which decides.
    model_config = ConfigDict(strict=True, extra="allow")

    role: str
    content: str | list[ContentPart] | None = None

    def to_template(self, where: str = "messages", images: bool = False) -> dict[str, Any]:
        """The message as templates take it. Text parts stay a list: the tokenizer joins them
        for templates that want a string (inferd/tokenizer/content_format.py). `images`:
        `image_url` parts stay too (the chat pipeline decodes them: multimodal/image_parts.py).
        Other parts (audio, files) are a 400 naming the part and its type."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                at = f"{where}.content[{j}]"
                if images and part.type == "image_url":
                    continue
                if part.type != "text":
                    raise InvalidRequest(
                        f"{at}.type",
                        f"{at}.type: content parts of type {part.type!r} are not supported (this "
                        "server reads text only: 'text' parts)",
                    )
                if part.text is None:
                    raise InvalidRequest(f"{at}.text", f"{at}.text is required in a 'text' part")
            message["content"] = [p.model_dump(exclude_none=True) for p in self.content]
        elif self.content is None:
            message["content"] = ""
        return message

    def text(self) -> str:
        """The message's text: text parts joined by a line break, as string templates see
        them (the tokenizer's rule, vLLM's too)."""
        if isinstance(self.content, list):
            return "\n".join(p.text or "" for p in self.content)
        return self.content or ""


class ChatTemplateFields(Body):
    """How a conversation becomes a prompt (the chat route and /tokenize)."""

    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # HF's name: special-token strings typed into messages stay text (no forged turns);
    # false lets them through as special tokens, for trusted clients.
    split_special_tokens: bool = True
    tools: list[dict[str, Any]] | None = None

    def template_messages(self, images: bool = False) -> list[dict[str, Any]]:
        """The messages as templates take them; `images`: with their `image_url` parts (the
        routes that generate read them; /tokenize refuses them)."""
        if not self.messages:
            raise InvalidRequest("messages", "messages must contain at least one message")
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequest(
                "continue_final_message",
                "continue_final_message cannot be combined with add_generation_prompt: "
                "set add_generation_prompt to false to continue the final message",
            )
        return [m.to_template(f"messages[{i}]", images) for i, m in enumerate(self.messages)]


class ChatCompletionRequest(ChatTemplateFields, OpenAIFields):
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # OpenAI's; the chat template's variable of that name (prompts.with_reasoning_effort)
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    store: bool | None = None


class GenerateRequest(GenerationFields):
    """The simple endpoint: one prompt (text or token ids) → text, counts and timings."""

    prompt: str | TokenIds
    max_tokens: int | None = 16
    n: int = Field(default=1, ge=1, le=1)


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    split_special_tokens: bool = True
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: TokenIds
