"""What constraining a reply costs per token on the embedded model's 262,144-token vocabulary.

    python -m inferd.structured.benchmark [--rows N] [--repeat N]

Prints medians in µs for each piece of a constrained decode step: filling a mask row, checking a
sampled token (the check-first path), accepting it, and applying a mask row to float32 logits
with `LogitsMasker` against the plain `masked_fill` it replaces, next to the argmax over one row
(the cheapest thing a sampler does) as the peer. A benchmark, not a test: figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from inferd.structured.bitmask import LogitsMasker, allocate_bitmask
from inferd.structured.manager import GrammarManager
from inferd.structured.tokenizer_info import build_tokenizer_info
from inferd.structured_params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
REPLY = (
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", '
    '"poetry", "engines"], "address": {"city": "London", "zip": "W1"}}'
)


def _median_us(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="constrained rows for the apply")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    tokenizer = checkpoint_tokenizer(open_checkpoint(None))
    start = time.perf_counter()
    info = build_tokenizer_info(tokenizer, 262144)
    print(
        f"tokenizer info: {time.perf_counter() - start:.2f} s (token bytes cached after the first)"
    )

    with GrammarManager(info) as manager:
        spec = StructuredOutputsParams(json=SCHEMA)
        start = time.perf_counter()
        manager.compile(spec)
        print(f"compile JSON schema: {(time.perf_counter() - start) * 1e3:.2f} ms")
        handle = manager.submit(spec)
        copy_us = _median_us(lambda: manager.matcher(handle), args.repeat)
        print(f"matcher for a new sequence (copy of the cached one): {copy_us:.1f} µs")
        reply = tokenizer.encode(REPLY, add_special_tokens=False) + [info.eos_token_ids[-1]]
        bitmask = allocate_bitmask(max(args.rows, 1), info.bitmask_words)
        fill, check, accept = [], [], []
        for _ in range(5):  # fresh matchers: the first pass also warms llguidance's lexer
            matcher = manager.compile(spec)
            for token in reply:
                t0 = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                t1 = time.perf_counter()
                ok = matcher.allows(token)
                t2 = time.perf_counter()
                matcher.accept_tokens([token])
                t3 = time.perf_counter()
                assert ok, f"the schema rejects token {token} of its own example"
                fill.append(t1 - t0)
                check.append(t2 - t1)
                accept.append(t3 - t2)
    print(f"reply of {len(reply)} tokens, 5 passes; per token (µs): median / mean")
    for name, values in (("fill mask row", fill), ("check a token", check), ("accept", accept)):
        us = np.array(values) * 1e6
        print(f"  {name:16s} {np.median(us):8.1f} / {us.mean():8.1f}")

    vocab = info.vocab_size
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(args.rows, vocab, generator=g)
    random_masks = torch.randint(-(2**31), 2**31 - 1, bitmask.shape, dtype=torch.int32, generator=g)
    bitmask.copy_(random_masks)
    masker = LogitsMasker(vocab, info.bitmask_words)
    rows = list(range(args.rows))
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    banned = torch.from_numpy(bits == 0)

    def fast() -> None:
        masker.apply(logits, bitmask, rows)

    def naive() -> None:
        logits.masked_fill_(banned, float("-inf"))

    per_row = args.rows
    print(f"apply to {per_row} rows of {vocab} float32 logits; per row (µs):")
    print(f"  LogitsMasker     {_median_us(fast, args.repeat) / per_row:8.1f}")
    print(f"  masked_fill      {_median_us(naive, max(args.repeat // 10, 5)) / per_row:8.1f}")
    row = torch.randn(1, vocab, generator=g)
    print(f"  peer: argmax     {_median_us(lambda: row.argmax(dim=-1), args.repeat):8.1f}")


if __name__ == "__main__":
    main()
