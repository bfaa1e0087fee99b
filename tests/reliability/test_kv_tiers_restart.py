"""The disk KV tier end to end on the embedded model in the default mode: a restart finds the
blocks the last run computed and produces the same greedy tokens as a run that recomputes them;
damaged files are recomputed, never served (engine/kv_tiers/)."""

from __future__ import annotations

import time

import pytest

from inferd import LLM, SamplingParams
from inferd.engine.kv_tiers.block_store import BlockStore

PROMPT = "A short history of the printing press, told in plain words: " + "it began " * 40
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def run_once(folder) -> tuple[list[int], int, object]:
    llm = LLM(kv_cache_memory=64 << 20, max_num_batched_tokens=512, kv_offload_dir=str(folder),
              kv_offload_disk=64 << 20)  # fmt: skip
    try:
        out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
        stats = llm.engine.core.stats()
    finally:
        llm.shutdown()  # writes what the tier's thread still holds
    return out.outputs[0].token_ids, out.num_cached_tokens, stats


def test_restart_loads_blocks_and_damage_is_recomputed(default_llm, tmp_path):
    expected = default_llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    tokens, cached, stats = run_once(tmp_path)
    assert tokens == expected and cached == 0 and stats.kv_blocks_saved > 0
    files = sorted(tmp_path.rglob("*.kv"))
    assert len(files) == stats.kv_blocks_saved
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)

    tokens, cached, stats = run_once(tmp_path)  # a restart: the blocks come from disk
    assert tokens == expected
    assert cached > 0 and stats.kv_blocks_loaded == cached // 16
    (disk,) = stats.kv_tiers
    assert disk.hits == stats.kv_blocks_loaded and disk.damaged == 0

    for f in tmp_path.rglob("*.kv"):  # every block damaged: all recomputed, same tokens
        data = bytearray(f.read_bytes())
        data[-1] ^= 0x5A
        f.write_bytes(bytes(data))
    tokens, cached, stats = run_once(tmp_path)
    assert tokens == expected and cached == 0 and stats.kv_blocks_loaded == 0
    assert stats.kv_tiers[0].damaged == 1  # the first block's check stops the lookup


def test_bad_tier_flags_are_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="needs both --kv-offload-dir"):
        LLM(kv_offload_dir=str(tmp_path))
    with pytest.raises(ValueError, match="need prefix caching"):
        LLM(kv_offload_memory=1 << 20, enable_prefix_caching=False)


_WRITER = """
import sys
from pathlib import Path
from inferd.engine.kv_tiers.block_store import BlockStore
s = BlockStore("disk", Path(sys.argv[1]), b"i" * 32, 1 << 30, 1 << 20)
print("ready", flush=True)
i = 0
while True:
    s.write(i.to_bytes(32, "little"), memoryview(bytes([i % 251]) * (1 << 20)))
    i += 1
"""


def test_a_writer_killed_mid_write_leaves_only_whole_blocks(tmp_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout.readline().strip() == b"ready"
    deadline = time.monotonic() + 10
    while len(list(tmp_path.rglob("*.kv"))) < 20 and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader = BlockStore("disk", tmp_path, b"i" * 32, 1 << 30, 1 << 20)
    names = sorted(int.from_bytes(bytes.fromhex(p.stem), "little") for p in tmp_path.rglob("*.kv"))
    assert len(names) >= 20
    for i in names:  # every published file is whole and checked
        assert reader.read(i.to_bytes(32, "little")).tobytes() == bytes([i % 251]) * (1 << 20)
    assert reader.snapshot().damaged == 0
