"""The image side of a step, on the device: each image whose placeholders a row computes is
encoded (the model's vision tower and projector) once, and its rows given to the row as
`SequenceStep.embeds` (runner.py puts them in place of the placeholders' embeddings).

The encoder cache keeps encodings by the image's content hash (vLLM's encoder cache, llama.cpp's
`mtmd` image cache): the same image in another request, or in a chunk after the first, or after a
preemption, is not encoded again. It is bounded in bytes and forgets the least recently used.
`encodes` counts the images actually run through the encoder (the tests read it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from inferd.engine.execution.device_state import DeviceSequences, SequenceStep
from inferd.engine.scheduling.step import StepRecord
from inferd.multimodal.image_input import ImageInput, pixel_values

DEFAULT_CACHE_BYTES = 256 * 2**20


class EncoderCache:
    def __init__(self, model, capacity_bytes: int = DEFAULT_CACHE_BYTES):
        self.model, self.capacity = model, capacity_bytes
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.encodes = 0  # images run through the encoder since start

    def features(self, images: Sequence[ImageInput]) -> list[torch.Tensor]:
        """Each image's rows [length, hidden] float32: cached ones as they are, the others
        encoded together in one batch."""
        missing = {i.content_hash: i for i in images if i.content_hash not in self.entries}
        if missing:
            todo = list(missing.values())
            pixels = torch.stack([pixel_values(i) for i in todo])
            with torch.inference_mode():
                encoded = self.model.encode_images(pixels)
            self.encodes += len(todo)
            for image, rows in zip(todo, encoded, strict=True):
                self._put(image.content_hash, rows.clone())
        out = []
        for image in images:
            rows = self.entries[image.content_hash]
            self.entries.move_to_end(image.content_hash)
            if rows.shape[0] != image.length:
                raise ValueError(f"an image has {image.length} placeholders, its encoding "
                                 f"{rows.shape[0]} rows")  # fmt: skip
            out.append(rows)
        return out

    def _put(self, key: bytes, rows: torch.Tensor) -> None:
        self.entries[key] = rows
        self.bytes += rows.numel() * rows.element_size()
        # NOTE: the newest entry stays even over capacity: this step needs it.
        while self.bytes > self.capacity and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


def attach_images(cache: EncoderCache | None, record: StepRecord, rows: list[SequenceStep],
                  sequences: DeviceSequences) -> None:  # fmt: skip
    """Give each row the image rows its tokens cover (rows[i] is record.rows[i]'s)."""
    wanted: list[tuple[SequenceStep, ImageInput]] = []
    for row, step in zip(record.rows, rows, strict=True):
        images = sequences[row.seq_id].images
        if not images:
            continue
        start, end = step.num_computed, step.num_computed + len(step.token_ids)
        wanted += [(step, i) for i in images if i.offset < end and start < i.offset + i.length]
    if not wanted:
        return
    if cache is None:
        raise ValueError("a row holds image placeholders, but the model has no image encoder")
    features = cache.features([i for _, i in wanted])
    for (step, image), block in zip(wanted, features, strict=True):
        start, end = step.num_computed, step.num_computed + len(step.token_ids)
        lo, hi = max(image.offset, start), min(image.offset + image.length, end)
        part = block[lo - image.offset : hi - image.offset]
        step.embeds = (*step.embeds, (lo - start, part))
