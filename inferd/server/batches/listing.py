"""OpenAI's cursor pages, as `GET /v1/files` and `GET /v1/batches` answer them: `after` names
the last id of the previous page, `has_more` says whether another page follows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd.errors import InvalidRequest


def checked_limit(limit: int, most: int) -> int:
    if not 1 <= limit <= most:
        raise InvalidRequest("limit", f"limit must be between 1 and {most}, got {limit}")
    return limit


def page(items: list[Any], after: str | None, limit: int,
         public: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """`items` in listing order; the page after the one whose id is `after` (400 for an id not
    among them, e.g. a file deleted since: starting over would list some items twice)."""
    data = [public(x) for x in items]
    if after is not None:
        ids = [d["id"] for d in data]
        if after not in ids:
            raise InvalidRequest("after", f"after: {after!r} is not in the list (deleted, or "
                                          "expired, since the previous page?)")  # fmt: skip
        data = data[ids.index(after) + 1 :]
    shown = data[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(data) > limit,
    }
