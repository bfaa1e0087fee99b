"""What the routes share: the engine client, the served names and the metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from inferd.engine_client import EngineClient, ModelInfo, TokenizerLike
from inferd.errors import InvalidRequest
from inferd.server.errors import APIError
from inferd.server.metrics import ServerMetrics
from inferd.server.responses import TokenText


@dataclass
class ServerState:
    client: EngineClient
    model_names: list[str]  # the first is the one reported in responses
    metrics: ServerMetrics
    texts: TokenText
    created: int = field(default_factory=lambda: int(time.time()))
    request_timeline: bool = False  # the server returns a request's timeline when asked

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
        if name and name not in self.model_names:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves "
                f"{', '.join(map(repr, self.model_names))}",
                param="model",
                code="model_not_found",
            )
        return name or self.model_name

    async def tokenize(self, function: Any, *args: Any) -> Any:
        """Tokenizer work runs in a worker thread: templates and long prompts take milliseconds
        that other clients' streams should not wait for."""
        return await asyncio.to_thread(function, *args)

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


def get_state(request: Request) -> ServerState:
    return request.app.state.inferd
