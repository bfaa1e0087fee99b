"""The responses `/v1/responses` keeps (`store`), in memory, for `previous_response_id` and
`GET` / `DELETE /v1/responses/{id}`.

Bounded by count (`--max-stored-responses`): the least recently used response goes first, and
reading one (GET, or continuing it) counts as a use. A server restart forgets them all, as a
store of conversations held by nobody but this process must. Event loop only: no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as the client got it
    conversation: list[dict[str, Any]]  # chat messages: the input so far, then the output


class ResponseStore:
    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"max_stored_responses must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
