"""Images inside chat messages, as the APIs spell them, → decoded images, and the messages as
chat templates take them: each image part becomes `{"type": "image"}` (HF's marker, which
vision models' templates turn into their placeholder: `<image>`, `<start_of_image>`).

* OpenAI chat `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` (the
  Responses API's `input_image` and Anthropic's base64 `image` blocks are translated to it);
* the offline API's `{"type": "image_pil", "image_pil": <PIL image>}` (vLLM's spelling).

Only base64 `data:` URLs are read: an http(s) URL would make the server fetch whatever a client
names, and servers are often offline; it is refused, saying to send the image inline.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from inferd.errors import InvalidRequest
from inferd.multimodal.image_decode import decode_image

IMAGE_PART_TYPES = ("image_url", "image_pil")


def image_from_url(url: Any, param: str):
    """A `data:` URL's image, decoded and checked (image_decode.py)."""
    if not isinstance(url, str):
        raise InvalidRequest(param, f"{param} must be a string (a data: URL)")
    if url.startswith(("http://", "https://")):
        raise InvalidRequest(param, f"{param}: image URLs are not fetched by this server; send "
                             "the image inline as a base64 data: URL "
                             "(data:image/png;base64,...)")  # fmt: skip
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


def split_images(messages: list[dict[str, Any]], where: str = "messages"):
    """(the messages with every image part as `{"type": "image"}`, the decoded images in
    order). Messages without image parts are passed as they are."""
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
                images.append(image_from_url(url, f"{at}.image_url.url"))
            else:
                images.append(decode_image(part.get("image_pil"), f"{at}.image_pil"))
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, images


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES
