"""The default mode's numbers do not depend on the CPU they run on (README, "The same answer
whatever else runs").

Its logits are the same bits in every C kernel variant (each vector ISA's tiles perform the
portable C's integer and IEEE operations; variants this CPU lacks run emulated,
tests/kernel_variants.py), and in a process set up as the plainest x86-64 CPU would run it:
the portable kernels on one thread, PyTorch's CPU code without its vector kernels
(ATEN_CPU_CAPABILITY=default) and glibc's maths functions without their AVX2/FMA versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_variants import VARIANT_NAMES, available_variants, use_variant
from logits_probe import step_logits
from tiny_gguf import write_tiny_gguf

from inferd import LLM
from inferd.cpu_info import machine

PROBE = Path(__file__).with_name("logits_probe.py")


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
def test_every_kernel_variant_gives_the_same_logits(tmp_path, monkeypatch, c_kernels):
    here = available_variants()
    if here == ["portable"]:
        pytest.skip("only the portable kernels run (or are emulated) here: nothing to compare")
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")  # a tiny file stays out of the user's cache
    path = tmp_path / "tiny-qwen3.gguf"
    write_tiny_gguf(path, "qwen3")
    logits = {}
    for name in here:
        with pytest.MonkeyPatch.context() as patch:
            use_variant(patch, name)
            logits[name] = step_logits(LLM(model=str(path), kv_cache_memory=16 << 20))
    assert len(logits["portable"]) == 6  # a step per generated token
    differ = [name for name in here if not _same(logits[name], logits["portable"])]
    assert not differ, f"{differ} differ from portable (ran: {here} of {VARIANT_NAMES})"


@pytest.mark.slow
def test_the_plainest_cpu_gives_the_same_logits(default_llm, tmp_path):
    if machine() != "x86_64":
        pytest.skip("the plain settings below are x86-64's")
    plain = {**os.environ, "INFERD_CPU_KERNELS": "portable", "OMP_NUM_THREADS": "1",
             "ATEN_CPU_CAPABILITY": "default", "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA",
             "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    out = tmp_path / "logits.pt"
    done = subprocess.run([sys.executable, str(PROBE), "-", str(out)], env=plain,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert _same(torch.load(out), step_logits(default_llm))
