"""Settings of the APIs themselves, from `inferd serve` flags (inferd/commands/serve_api.py)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STORED_RESPONSES = 256


@dataclass(frozen=True)
class APISettings:
    # vLLM's --return-tokens-as-token-ids: every logprobs token is named "token_id:N", as if
    # each request asked for it (a request may still ask on a server without the flag).
    return_tokens_as_token_ids: bool = False
    # /v1/responses: how many responses `store` keeps for `previous_response_id` and
    # GET /v1/responses/{id}, least recently used dropped first; 0 stores none.
    max_stored_responses: int = DEFAULT_STORED_RESPONSES
    # Hosts whose http(s) image URLs chat messages may name (vLLM's --allowed-media-domains);
    # empty: every image URL is refused, images come inline (inferd/multimodal/image_fetch.py).
    allowed_media_domains: tuple[str, ...] = ()
