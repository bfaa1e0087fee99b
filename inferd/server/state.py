"""What the routes share: the engine client, the served names, the metrics, admission control
and the error log."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from inferd.engine_client import EngineClient, ModelInfo, TokenizerLike
from inferd.errors import InvalidRequest
from inferd.lora_request import LoRARequest
from inferd.server.generation.serving import BACKGROUND, RequestGroup
from inferd.server.http.admission import Admission, text_bytes
from inferd.server.http.api_settings import APISettings
from inferd.server.http.errors import APIError, ErrorLog
from inferd.server.metrics.prometheus import ServerMetrics
from inferd.server.openai.shapes import TokenIdText, TokenText
from inferd.server.openai.tool_calls import ToolSettings

# Texts above this size are tokenized one at a time: an encode of megabytes keeps a core busy
# for seconds, and several at once would take every core from the engine.
LARGE_INPUT_BYTES = 256 << 10
RESERVATIONS = "inferd.reservations"  # ASGI scope key: what an HTTP request holds


@dataclass
class ServerState:
    client: EngineClient
    model_names: list[str]  # the first is the one reported in responses
    metrics: ServerMetrics
    texts: TokenText
    admission: Admission
    errors: ErrorLog = field(default_factory=ErrorLog)
    created: int = field(default_factory=lambda: int(time.time()))
    tools: ToolSettings = field(default_factory=ToolSettings)
    request_timeline: bool = False  # the server returns a request's timeline when asked
    api: APISettings = field(default_factory=APISettings)
    # LoRA adapters served by name (--lora-modules): a request's `model` picks one.
    adapters: dict[str, LoRARequest] = field(default_factory=dict)
    next_lora_id: int = 1  # for adapters loaded at run time (extra/lora.py)
    _large_inputs: asyncio.Semaphore | None = None

    def token_texts(self, as_token_ids: bool) -> TokenText:
        """How logprobs name tokens: their text, or "token_id:N" (return_tokens_as_token_ids,
        asked for by the request or for all by the server's flag)."""
        as_ids = as_token_ids or self.api.return_tokens_as_token_ids
        return TokenIdText(self.texts) if as_ids else self.texts

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def info(self) -> ModelInfo:
        return self.client.model_info

    @property
    def tokenizer(self) -> TokenizerLike:
        return self.client.tokenizer

    def check_model(self, name: str | None) -> str:
        """The model a request names must be one this server serves (404 otherwise)."""
        if name and name not in self.model_names and name not in self.adapters:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves "
                f"{', '.join(map(repr, [*self.model_names, *self.adapters]))}",
                param="model",
                code="model_not_found",
            )
        return name or self.model_name

    def with_adapter(self, prompts: list[dict[str, Any]], name: str | None) -> list[dict]:
        """The prompts, each naming the LoRA adapter the request's `model` is (if it is one)."""
        lora = self.adapters.get(name) if name else None
        if lora is None:
            return prompts
        return [{**p, "lora_request": lora} for p in prompts]

    async def tokenize(self, function: Any, *args: Any, nbytes: int = 0) -> Any:
        """Tokenizer work runs in a worker thread (the tokenizer releases Python's lock for
        long texts: `encode_unlocked` in inferd/tokenizer/text_guard.py); inputs of `nbytes`
        over LARGE_INPUT_BYTES wait for each other."""
        if nbytes <= LARGE_INPUT_BYTES:
            return await asyncio.to_thread(function, *args)
        if self._large_inputs is None:
            self._large_inputs = asyncio.Semaphore(1)  # created inside the running loop
        async with self._large_inputs:
            return await asyncio.to_thread(function, *args)

    def admit(self, request: Request, prompts: list[Any], n: int, param: str = "prompt",
              keep: int | None = None) -> RequestGroup:  # fmt: skip
        """Admission (server/http/admission.py) for a generation request, before any tokenization:
        raises 400 for a request that can never be served, 503 when the queue is full. `keep`:
        the request's truncate_prompt_tokens. The group returned holds the request's place
        until it ends."""
        reservation = self.admission.admit(prompts, n, param, keep)
        request.scope.setdefault(RESERVATIONS, []).append(reservation)
        nbytes = sum(text_bytes(p) for p in prompts if isinstance(p, str))

        async def tokenize(function: Any, *args: Any) -> Any:
            return await self.tokenize(function, *args, nbytes=nbytes)

        return RequestGroup(self.client, reservation, tokenize, param,
                            background=request.scope.get(BACKGROUND, False))  # fmt: skip

    def check_timeline(self, wanted: bool) -> bool:
        """Whether to return the request's timeline; refused (400) unless the server allows it:
        the cached-prefix count tells whether others sent the same prompt prefix."""
        if wanted and not self.request_timeline:
            raise InvalidRequest(
                "return_timeline",
                "return_timeline: this server does not return request timelines (start it "
                "with --enable-request-timeline)",
            )
        return wanted


class ReleaseMiddleware:
    """Gives back whatever admission a request still holds when its ASGI call ends (a stream's
    call ends with the stream), however it ended: an error, a disconnect, a cancellation."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = scope.setdefault(RESERVATIONS, [])
        try:
            await self.app(scope, receive, send)
        finally:
            for reservation in held:
                reservation.release()


def get_state(request: Request) -> ServerState:
    return request.app.state.inferd


def note_user(request: Request, body: Any) -> None:
    """The end user a request names (`user`, `safety_identifier`) goes into its access-log line:
    OpenAI asks for these so that an operator can trace abuse to a user."""
    who = getattr(body, "safety_identifier", None) or getattr(body, "user", None)
    if who:
        request.state.inferd_user = who
