"""Tensor parallelism on one machine opens nothing reachable from outside: the ranks meet through
a file in a private directory (no TCP store listening on every interface) and gloo's connections
listen on loopback only."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil
import pytest
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams


def _listening(pids: set[int]) -> list[str]:
    return sorted(
        f"{c.laddr.ip}:{c.laddr.port}"
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    )


def test_tp_ranks_listen_on_loopback_only_and_leave_no_rendezvous(tmp_path):
    checkpoint = make_tiny_checkpoint("llama", tmp_path / "llama")
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("inferd-tp-*"))
    llm = LLM(model=str(checkpoint), dtype="float32", tensor_parallel_size=2,
              kv_cache_memory=8 << 20, max_model_len=128)  # fmt: skip
    try:
        workers = {p.pid for p in llm.engine.runner.procs}
        assert workers and all(psutil.pid_exists(pid) for pid in workers)
        sockets = _listening({os.getpid(), *workers})
        if not sockets and not psutil.net_connections(kind="inet"):
            pytest.skip("this system does not let psutil see sockets")
        assert sockets, "gloo's connections should be listening"
        assert all(s.startswith(("127.", "[::1]", "::1")) for s in sockets), sockets
        assert set(tmp.glob("inferd-tp-*")) == before  # the rendezvous is gone
        greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        out = llm.generate([[1, 5, 6, 7]], greedy, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 4
    finally:
        llm.shutdown()
