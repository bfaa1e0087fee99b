"""How a full KV block is named: the chained sha256 of the tokens up to its end. The engine's
prefix cache (engine/scheduling/kv_cache.py, engine/scheduling/request.py) and the routers that
send a prompt to the replica holding its prefix (engine/frontend/dp_router.py,
ray_serve/prefix_table.py) share this one definition, so a router's match is exactly the blocks a
replica will not compute again.

Block i's hash covers tokens [0, (i + 1) * block_size): two prompts share cached blocks exactly
as far as their hash lists agree. The first block's parent is a root (the engine's model identity,
so blocks of different weights never match), mixed with the request's `cache_salt` if it has one
and its LoRA adapter if it runs under one (`prompt_root`).

A block holding an image's placeholder tokens also covers the image: its name mixes in the
image's content hash and where the image starts (`image_keys`), so two prompts with equal
tokens and different images never share a block, and the same image at the same place does.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def block_hash(parent: bytes, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """Chained hash of one full block: equal hashes mean equal token prefixes (sha256, so an
    accidental collision, which would silently mix two prompts' caches, is not a concern).
    `extra`: what else the block's keys and values depend on (`image_keys`)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes() + extra).digest()


def image_keys(images: Sequence, start: int, end: int) -> bytes:
    """The images (records with `offset`, `length`, `content_hash`: inferd/multimodal/
    image_input.py) whose placeholders overlap tokens [start, end): their hashes and offsets."""
    return b"".join(b"image\0" + i.content_hash + i.offset.to_bytes(8, "little")
                    for i in images if i.offset < end and start < i.offset + i.length)  # fmt: skip


def salted_root(root: bytes, salt: str | None) -> bytes:
    """The first block's parent hash: the root, mixed with the request's salt."""
    if not salt:
        return root
    return hashlib.sha256(root + b"cache_salt\0" + salt.encode("utf-8")).digest()


def adapter_root(root: bytes, lora) -> bytes:
    """The root of a request run under a LoRA adapter (a LoRARequest, or None: the base
    model's root): keys and values computed under different weights never match."""
    if lora is None:
        return root
    return hashlib.sha256(root + b"lora\0" + lora.identity.encode("utf-8")).digest()


def prompt_root(root: bytes, salt: str | None, lora) -> bytes:
    """The first block's parent for a request: the root mixed with its `cache_salt`, then with
    its adapter (a LoRARequest or None). NOTE: the engine's cache and the routers both start
    here, so a router's names are the ones a replica's cache registers."""
    return adapter_root(salted_root(root, salt), lora)


def prompt_block_hashes(token_ids: Sequence[int], block_size: int, root: bytes,
                        salt: str | None = None, lora=None,
                        images: Sequence = ()) -> list[bytes]:  # fmt: skip
    """The chained hashes of every full block of `token_ids`, for a request with this
    `cache_salt`, adapter and images."""
    parent, hashes = prompt_root(root, salt, lora), []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        end = start + block_size
        parent = block_hash(parent, token_ids[start:end], image_keys(images, start, end))
        hashes.append(parent)
    return hashes
