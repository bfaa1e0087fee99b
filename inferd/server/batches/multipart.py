"""A `multipart/form-data` body (RFC 7578), as `POST /v1/files` receives it: OpenAI's clients
send `purpose`, `file` (with a filename) and `expires_after[anchor]` / `expires_after[seconds]`.

Read here rather than with python-multipart (Starlette's reader), which inferd would need as one
more dependency for this one route: the body is already whole in memory (the size limit's
middleware buffers it, server/http/limits.py), and splitting it at the boundary is a few
`bytes.find` calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferd.errors import InvalidRequest

_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)="?([^";]*)"?')


@dataclass
class Part:
    name: str
    filename: str | None
    data: bytes


def boundary_of(content_type: str) -> bytes:
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise InvalidRequest("file", "upload a file as multipart/form-data (fields purpose and "
                                     f"file), not {kind.strip() or 'no content type'}")  # fmt: skip
    for key, value in _PARAM.findall(";" + params):
        if key.lower() == "boundary" and value:
            return value.encode("latin-1")
    raise InvalidRequest("file", "the multipart/form-data content type names no boundary")


def parse_form(body: bytes, content_type: str) -> list[Part]:
    """The form's parts, in order; 400 for a body that is not well-formed multipart."""
    delimiter = b"--" + boundary_of(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise InvalidRequest("file", "the multipart body holds no part")
    parts = []
    at = start + len(delimiter)
    while not body.startswith(b"--", at):  # "--" after a delimiter closes the form
        head_end = body.find(b"\r\n\r\n", at)
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if head_end < 0 or end < 0:
            raise InvalidRequest("file", "the multipart body is cut short (a part has no end)")
        parts.append(_part(body[at:head_end].decode("utf-8", "replace"), body[head_end + 4 : end]))
        at = end + 2 + len(delimiter)
    return parts


def _part(head: str, data: bytes) -> Part:
    for line in head.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            params = {k.lower(): v for k, v in _PARAM.findall(value)}
            if "name" in params:
                return Part(params["name"], params.get("filename"), data)
    raise InvalidRequest("file", "a multipart part has no Content-Disposition name")
