"""The KV budget on a GPU (inferd/memory/gpu_budget.py), with the device's memory readings
replaced: what this engine may take when another process holds part of the GPU."""

from __future__ import annotations

import pytest
import torch

from inferd.memory import gpu_budget

GIB = 2**30


@pytest.fixture
def gpu(monkeypatch):
    """A 100 GiB GPU whose free memory and reserved bytes the test sets."""
    state = {"free": 100 * GIB, "reserved": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 100 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    return state


def test_alone_on_the_gpu_the_budget_is_its_share_less_what_it_holds(gpu):
    gpu["free"], gpu["reserved"] = 100 * GIB - 3 * GIB - GIB // 2, 3 * GIB  # + 0.5 GiB context
    b = gpu_budget.gpu_kv_budget(torch.device("cuda"), 0.9, 2 * GIB, GIB)
    assert b.non_torch == GIB // 2
    assert b.kv_budget == int(100 * GIB * 0.9) - 2 * GIB - GIB - GIB // 2


def test_memory_another_process_held_at_start_is_not_charged(gpu):
    gpu["free"] = 60 * GIB  # a replica beside it holds 40 GiB
    before = gpu_budget.memory_in_use(torch.device("cuda"))
    assert before == 40 * GIB
    gpu["free"], gpu["reserved"] = 60 * GIB - 3 * GIB, 3 * GIB  # this engine's weights, peak
    b = gpu_budget.gpu_kv_budget(torch.device("cuda"), 0.42, 2 * GIB, GIB, before)
    assert b.non_torch == 0
    assert b.kv_budget == int(100 * GIB * 0.42) - 3 * GIB
    # Counted against it (the old accounting), the other replica left nothing:
    with pytest.raises(ValueError, match="no GPU memory left"):
        gpu_budget.gpu_kv_budget(torch.device("cuda"), 0.42, 2 * GIB, GIB)


def test_a_share_larger_than_what_was_free_is_refused(gpu):
    with pytest.raises(ValueError, match="asks for 90.00 GiB.*40.00 GiB .* in use.*lower it"):
        gpu_budget.gpu_kv_budget(torch.device("cuda"), 0.9, 2 * GIB, GIB, 40 * GIB)


def test_a_kv_sizing_flag_that_would_do_nothing_is_refused(tmp_path):
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM
    from inferd.config import EngineConfig
    from inferd.engine.scheduling.kv_budget import check_kv_flags

    folder = make_tiny_checkpoint("llama", tmp_path / "m")
    with pytest.raises(ValueError, match="sizes the KV cache on a GPU.*runs on cpu"):
        LLM(model=str(folder), device="cpu", gpu_memory_utilization=0.5)
    both = EngineConfig(gpu_memory_utilization=0.5, kv_cache_memory=GIB)
    with pytest.raises(ValueError, match="both size the KV cache"):
        check_kv_flags(both, torch.device("cuda"))
    check_kv_flags(EngineConfig(gpu_memory_utilization=0.5), torch.device("cuda"))
    check_kv_flags(EngineConfig(kv_cache_memory=GIB), torch.device("cpu"))
