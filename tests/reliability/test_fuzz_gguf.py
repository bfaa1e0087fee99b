"""Fuzzing the GGUF reader: a valid tiny file with bits flipped, bytes overwritten and its end
cut off, at many seeded places. Opening each mutant (and, when it opens, building its
tokenizer and loading its weights) either works or raises ModelLoadError, never anything else,
and never takes long."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from crafted_gguf import GGUFSpec

from inferd.errors import ModelLoadError
from inferd.loader import open_checkpoint
from inferd.loader.gguf_file import GGUFFile
from inferd.loader.model_loader import load_model
from inferd.tokenizer import Tokenizer

SEED = 16
SECONDS_PER_FILE = 2.0  # generous: each mutant takes milliseconds; a hang or a blow-up does not


def mutants(data: bytes, header_end: int, rng: random.Random):
    """(description, bytes): bit flips and 0xFF runs in the header, cuts anywhere."""
    for _ in range(300):
        pos, bit = rng.randrange(header_end), rng.randrange(8)
        out = bytearray(data)
        out[pos] ^= 1 << bit
        yield f"bit {bit} of byte {pos} flipped", bytes(out)
    for _ in range(100):
        pos, width = rng.randrange(header_end), rng.choice((1, 2, 4, 8))
        out = bytearray(data)
        out[pos : pos + width] = rng.choice((b"\xff", b"\x00", b"\x80")) * width
        yield f"{width} bytes at {pos} overwritten", bytes(out)
    for cut in sorted(rng.sample(range(len(data)), 60)):
        yield f"cut at byte {cut}", data[:cut]


def open_fully(path: Path) -> None:
    checkpoint = open_checkpoint(path)
    tok = Tokenizer.from_gguf(checkpoint.gguf, cache=False)
    tok.decode(tok.encode("abc a ca"))
    load_model(checkpoint, torch.float32, torch.device("cpu"))


def test_mutated_gguf_fails_only_with_model_load_error(tmp_path):
    data = GGUFSpec().to_bytes()
    clean = tmp_path / "clean.gguf"
    clean.write_bytes(data)
    open_fully(clean)  # the unmutated file works end to end
    header_end = min(info.offset for info in GGUFFile(clean).tensors.values())
    outcomes = {"opened": 0, "refused": 0}
    path = tmp_path / "mutant.gguf"
    for what, mutated in mutants(data, header_end, random.Random(SEED)):
        path.write_bytes(mutated)
        start = time.perf_counter()
        try:
            open_fully(path)
            outcomes["opened"] += 1
        except ModelLoadError as e:
            assert "\n" not in str(e), (what, str(e))
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - the point: report what escaped, and where
            pytest.fail(f"{what}: {type(e).__name__}: {e}")
        elapsed = time.perf_counter() - start
        assert elapsed < SECONDS_PER_FILE, (what, elapsed)
    # Both outcomes occur: the mutations reach the checks and also leave harmless changes.
    assert outcomes["refused"] > 100 and outcomes["opened"] > 10, outcomes
