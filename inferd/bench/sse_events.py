"""The `data` of server-sent events, from a stream read in chunks of whatever size arrived.

The benchmark client reads each response in the chunks the socket gives (aiohttp's
`iter_any`), not a line per await: it shares the machine's cores with the server it measures,
and one await per SSE line (two a token: the `data:` line and the blank line after it) costs
more than splitting a chunk here. A chunk may hold several events or part of one; lines may end
in LF, CRLF or CR (the SSE specification allows all three). An event's `data` is its `data:`
lines joined by newlines; other fields (`event:`, `id:`, `retry:`) and comments (`:`) are
skipped, since the OpenAI, Responses and Anthropic streams all carry their payload in `data`.
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEDataSplitter:
    def __init__(self) -> None:
        self._partial = b""  # the start of a line whose end has not arrived
        self._data: list[bytes] = []  # the current event's data lines so far
        self._cr_pending = False  # the last chunk ended in CR: an LF next belongs to it

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that `chunk` completes, in order."""
        if self._cr_pending and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._cr_pending = chunk.endswith(b"\r")
        lines = _LINE_END.split(self._partial + chunk)
        self._partial = lines.pop()  # what follows the last line end (b"" when none)
        events = []
        for line in lines:
            if not line:  # a blank line ends an event
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events
