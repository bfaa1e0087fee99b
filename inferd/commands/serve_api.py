"""`inferd serve` flags of the APIs themselves (vLLM's names where vLLM has the flag), and the
`APISettings` they become (inferd/server/http/api_settings.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.server.http.api_settings import APISettings


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    from inferd.server.http.api_settings import DEFAULT_STORED_RESPONSES  # plain data, no FastAPI

    api = parser.add_argument_group("APIs")
    api.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help='name every logprobs token "token_id:N", as if each request asked for it '
        "(tokens whose text is not valid UTF-8 alone stay tellable apart)",
    )
    api.add_argument(
        "--max-stored-responses",
        type=_count,
        default=DEFAULT_STORED_RESPONSES,
        help="/v1/responses: responses kept in memory for previous_response_id and GET "
        "/v1/responses/{id} (store: true), least recently used dropped first; 0 keeps none",
    )
    api.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=[],
        metavar="HOST",
        help="hosts whose http(s) image URLs chat messages may name, fetched by the server "
        "(default: none: image URLs are refused, images must come as base64 data: URLs)",
    )


def api_settings(args: argparse.Namespace) -> APISettings:
    from inferd.server.http.api_settings import APISettings

    return APISettings(
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        max_stored_responses=args.max_stored_responses,
        allowed_media_domains=tuple(args.allowed_media_domains),
    )
