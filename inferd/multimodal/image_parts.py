"""Images inside chat messages, as the APIs spell them, → decoded images, and the messages as
chat templates take them: each image part becomes `{"type": "image"}` (HF's marker, which
vision models' templates turn into their placeholder: `<image>`, `<start_of_image>`).

* OpenAI chat `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` (the
  Responses API's `input_image` and Anthropic's base64 `image` blocks are translated to it);
* the offline API's `{"type": "image_pil", "image_pil": <PIL image>}` (vLLM's spelling).

Base64 `data:` URLs are read as they are. An http(s) URL is read only when the server fetched
it already (image_fetch.py: hosts listed by `--allowed-media-domains`); otherwise it is refused,
saying to send the image inline.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from inferd.errors import InvalidRequest
from inferd.multimodal.image_decode import decode_image

IMAGE_PART_TYPES = ("image_url", "image_pil")


def image_from_url(url: Any, param: str, fetched: dict[str, bytes] | None = None):
    """A `data:` URL's image, or a fetched URL's (`fetched`: url → body), decoded and checked
    (image_decode.py)."""
    if not isinstance(url, str):
        raise InvalidRequest(param, f"{param} must be a string (a data: URL)")
    if fetched and url in fetched:
        return decode_image(fetched[url], param)
    if url.startswith(("http://", "https://")):
        message = (f"{param}: image URLs are not fetched by this server (only from hosts "
                   "listed by --allowed-media-domains); send the image inline as a base64 "
                   "data: URL (data:image/png;base64,...)")  # fmt: skip
        raise InvalidRequest(param, message)
    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise InvalidRequest(param, f"{param} must be a base64 data: URL "
                             "(data:image/png;base64,...)")  # fmt: skip
    media = head[len("data:") :].split(";")
    if "base64" not in media[1:]:
        raise InvalidRequest(param, f"{param}: only base64 data: URLs are read (';base64,')")
    if media[0] and not media[0].startswith("image/"):
        raise InvalidRequest(param, f"{param}: media type {media[0]!r} is not an image")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(param, f"{param}: the data is not valid base64") from None
    return decode_image(raw, param)


def image_parts(messages: list[dict[str, Any]], where: str = "messages"):
    """(param, url) of every image_url part, in order."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "image_url":
                inner = part.get("image_url")
                url = inner.get("url") if isinstance(inner, dict) else inner
                if isinstance(url, str):
                    yield f"{where}[{i}].content[{j}].image_url.url", url


def split_images(messages: list[dict[str, Any]], where: str = "messages",
                 fetched: dict[str, bytes] | None = None):  # fmt: skip
    """(the messages with every image part as `{"type": "image"}`, the decoded images in
    order); `fetched`: the bodies of http(s) URLs fetched already (image_fetch.py). Messages
    without image parts are passed as they are."""
    images, out = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not any(_is_image(p) for p in content):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if not _is_image(part):
                parts.append(part)
                continue
            at = f"{where}[{i}].content[{j}]"
            if part["type"] == "image_url":
                inner = part.get("image_url")
                url = inner.get("url") if isinstance(inner, dict) else inner
                images.append(image_from_url(url, f"{at}.image_url.url", fetched))
            else:
                images.append(decode_image(part.get("image_pil"), f"{at}.image_pil"))
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, images


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES
