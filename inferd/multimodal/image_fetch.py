"""http(s) image URLs in chat messages, fetched only from the hosts `inferd serve
--allowed-media-domains` lists (vLLM's flag): a server that fetched whatever a client named could
be made to reach hosts on its own network, and servers are often offline. Each fetch is bounded
in time and bytes and follows no redirects (a redirect could leave the listed host)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from inferd.errors import InvalidRequest
from inferd.multimodal.image_parts import image_parts

MAX_IMAGE_BYTES = 20 * 2**20
TIMEOUT_S = 10.0


def allowed_host(url: str, allowed: tuple[str, ...]) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return bool(host) and host in {a.lower() for a in allowed}


async def fetch_images(messages: list[dict[str, Any]], allowed: tuple[str, ...],
                       where: str = "messages") -> dict[str, bytes]:  # fmt: skip
    """url → body of every http(s) image URL in the messages whose host is allowed (the others
    are refused later, by `image_parts.image_from_url`)."""
    import httpx

    web = ("http://", "https://")
    wanted = {url: at for at, url in image_parts(messages, where)
              if url.startswith(web) and allowed_host(url, allowed)}  # fmt: skip
    out: dict[str, bytes] = {}
    if not wanted:
        return out
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as client:
        for url, at in wanted.items():
            out[url] = await _fetch(client, url, at)
    return out


async def _fetch(client, url: str, param: str) -> bytes:
    import httpx

    try:
        async with client.stream("GET", url) as reply:
            if reply.status_code != 200:
                raise InvalidRequest(param, f"{param}: fetching the image answered HTTP "
                                     f"{reply.status_code}")  # fmt: skip
            body = bytearray()
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > MAX_IMAGE_BYTES:
                    raise InvalidRequest(param, f"{param}: the image is over "
                                         f"{MAX_IMAGE_BYTES >> 20} MiB")  # fmt: skip
            return bytes(body)
    except httpx.HTTPError as e:
        raise InvalidRequest(param, f"{param}: the image could not be fetched ({e})") from None
