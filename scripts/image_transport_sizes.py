"""What an image costs to cross the front end → engine core boundary (ipc.py's msgpack), in
the three forms it could take: its pixels as uint8 after resize and crop (what inferd sends),
the float32 pixel values, or the encoder's output. Sizes for real models' shapes; the encode +
decode time of one `Add` message each, median of 50.

    python scripts/image_transport_sizes.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from inferd.engine.core.core_output import CoreRequest
from inferd.engine.transport import ipc
from inferd.multimodal.image_input import ImageInput
from inferd.sampling_params import SamplingParams

# name: (image side in pixels, placeholder tokens, text hidden size)
MODELS = {"LLaVA-1.5-7B": (336, 576, 4096), "Gemma 3 4B": (896, 256, 2560)}


def _round_trip_ms(payload: bytes, tokens: int) -> float:
    image = ImageInput(0, tokens, b"\0" * 32, payload, 1, len(payload))
    message = ipc.Add(CoreRequest("r", [7] * tokens, SamplingParams(), 16, 0.0, images=[image]))
    times = []
    for _ in range(50):
        t = time.perf_counter()
        ipc.decode_to_core(ipc.encode(message))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (side, tokens, hidden) in MODELS.items():
        forms = {
            "uint8 pixels (sent)": side * side * 3,
            "float32 pixel values": side * side * 3 * 4,
            "encoder output, float32": tokens * hidden * 4,
            "encoder output, bf16": tokens * hidden * 2,
        }
        print(f"{name}: {side}x{side} image, {tokens} tokens of {hidden}")
        for form, size in forms.items():
            ms = _round_trip_ms(rng.bytes(size), tokens)
            print(f"  {form:26s} {size / 1e6:7.2f} MB   encode+decode {ms:6.2f} ms")


if __name__ == "__main__":
    main()
