"""The bench peers' loading rules and the HF peer on an HF folder (what a GPU check without the
embedded GGUF compares against), on a tiny random checkpoint."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_checkpoint

from inferd.bench.peers import PeerUnavailable, load_peer
from inferd.bench.workload import BenchRequest


def test_llamacpp_needs_a_gguf_and_hf_a_gguf_or_a_folder(tmp_path):
    with pytest.raises(PeerUnavailable, match="it runs GGUF files"):
        load_peer("llamacpp", str(tmp_path), n_ctx=512, dtype="float32", threads=1)
    with pytest.raises(PeerUnavailable, match="GGUF file or an HF folder"):
        load_peer("hf", str(tmp_path), n_ctx=512, dtype="float32", threads=1)


def test_hf_peer_runs_an_hf_folder_on_the_given_device(tmp_path):
    folder = make_tiny_checkpoint("llama", tmp_path / "m")
    peer = load_peer("hf", str(folder), n_ctx=512, dtype="float32", threads=1, device="cpu")
    assert peer.info["device"] == "cpu"
    requests = [BenchRequest([1, 5, 9, 11], 3), BenchRequest([1, 7], 5)]
    timings = peer.generate(requests)
    assert [(t.prompt_tokens, t.output_tokens) for t in timings] == [(4, 3), (2, 5)]
    assert all(t.start <= t.first_token <= t.end for t in timings)
    peer.close()
