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


def test_llama_bench_peer_reads_its_report_into_a_request_timing(tmp_path, monkeypatch):
    from inferd.bench import llama_bench
    from inferd.bench.peers import parse_peers

    assert parse_peers("llamacpp,llama-bench") == ["llamacpp", "llama-bench"]
    report = ('[{"n_prompt": 128, "n_gen": 0, "avg_ns": 500000000, "avg_ts": 256.0},'
              ' {"n_prompt": 0, "n_gen": 128, "avg_ns": 2000000000, "avg_ts": 64.0}]')  # fmt: skip
    seconds = llama_bench.parse_report(report)
    assert seconds == {"pp": 0.5, "tg": 2.0}
    t = llama_bench.request_timing(BenchRequest([1] * 128, 128), 10.0, seconds)
    # the first token ends the prefill; the other 127 are 127/128 of the 128-token decode
    assert (t.start, t.first_token, t.end) == (10.0, 10.5, 10.5 + 2.0 * 127 / 128)
    assert (t.prompt_tokens, t.output_tokens) == (128, 128)
    prefill_only = llama_bench.request_timing(BenchRequest([1] * 8, 1), 0.0, {"pp": 0.25})
    assert prefill_only.first_token == prefill_only.end == 0.25
    with pytest.raises(ValueError, match="no report"):
        llama_bench.parse_report("error: failed to load model")
    monkeypatch.delenv("INFERD_LLAMA_BENCH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(PeerUnavailable, match="no llama-bench program"):
        load_peer("llama-bench", str(gguf), n_ctx=512, dtype="float32", threads=1)
    with pytest.raises(PeerUnavailable, match="it runs GGUF files"):
        load_peer("llama-bench", str(tmp_path), n_ctx=512, dtype="float32", threads=1)


def test_a_system_that_times_itself_lasts_what_its_timings_span():
    from inferd.bench.latency import run_latency
    from inferd.bench.metrics import RequestTiming

    class SelfTimed:  # as llama-bench: reported durations, not this process's clock
        name, load_seconds, info, times_itself = "self-timed", 0.0, {}, True

        def generate(self, requests):
            (r,) = requests
            return [RequestTiming(100.0, 100.5, 102.5, r.prompt_len, r.output_len)]

        def close(self):
            pass

    (result,) = run_latency([SelfTimed()], [], [[BenchRequest([1] * 8, 4)]] * 2)
    assert result.iteration.median == 2.5
    assert result.iteration_output_throughput == 4 / 2.5
