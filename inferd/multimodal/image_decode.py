"""What a caller sends as an image (encoded bytes, or a PIL image from the offline API) → an
RGB PIL image, checked: each thing that can be wrong is an InvalidRequest (HTTP 400) naming it.

* a format outside `FORMATS` (Pillow reads many more; these are what clients send);
* bytes Pillow cannot decode;
* a decompression bomb: more pixels than Pillow's `Image.MAX_IMAGE_PIXELS` (checked from the
  header, before a pixel is decoded: a 50 KB PNG can claim 2 GB of pixels).
"""

from __future__ import annotations

import io
import warnings

from inferd.errors import InvalidRequest

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def decode_image(data, param: str):
    """`data`: bytes or a PIL image. `param` names the request field in errors."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(data, Image.Image):
        image = data
        _check_pixels(image, param)
    elif isinstance(data, bytes | bytearray | memoryview):
        try:
            with warnings.catch_warnings():  # over the limit is refused below, by name
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(bytes(data)))
        except UnidentifiedImageError:
            raise InvalidRequest(param, "the image cannot be decoded: not an image format "
                                 f"inferd reads ({', '.join(FORMATS)})") from None  # fmt: skip
        except Image.DecompressionBombError as e:
            raise InvalidRequest(param, _bomb(str(e).split(",")[0])) from None
        except Exception as e:  # Pillow raises many types for damaged headers
            raise InvalidRequest(param, f"the image cannot be decoded ({e})") from None
        if image.format not in FORMATS:
            raise InvalidRequest(param, f"unsupported image format {image.format}; inferd "
                                 f"reads {', '.join(FORMATS)}")  # fmt: skip
        _check_pixels(image, param)
        try:
            image.load()
        except Exception as e:
            raise InvalidRequest(param, f"the image cannot be decoded ({e})") from None
    else:
        raise InvalidRequest(param, f"an image must be bytes or a PIL image, got "
                             f"{type(data).__name__}")  # fmt: skip
    return image if image.mode == "RGB" else image.convert("RGB")


def _check_pixels(image, param: str) -> None:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    w, h = image.size
    if limit is not None and w * h > limit:
        raise InvalidRequest(param, _bomb(f"{w}x{h} = {w * h} pixels"))
    if w < 1 or h < 1:
        raise InvalidRequest(param, f"the image is empty ({w}x{h})")


def _bomb(detail: str) -> str:
    from PIL import Image

    return (f"the image is too large ({detail}): more than Pillow's limit of "
            f"{Image.MAX_IMAGE_PIXELS} pixels (a decompression bomb?)")  # fmt: skip
