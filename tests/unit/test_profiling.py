"""Traces and step timing on tiny models (seconds): a trace names the engine's phases, layers and
C kernels; with no trace running, nothing of torch.profiler is created or entered."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine_client import ProfilerStateError
from inferd.profiling.instrument import instrument_model
from inferd.step_timing import STEP_KINDS, STEP_PHASES

PHASE_RANGES = {"inferd.step", *(f"inferd.{p}" for p in STEP_PHASES)}


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama")
    return LLM(model=str(folder), dtype="float32", kv_cache_memory=16 << 20, max_model_len=128)


def generate(llm: LLM, n: int = 6) -> None:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    llm.generate([[5, 6, 7, 8, 9], [11, 12, 13]], params, use_tqdm=False)


def _forbidden(*args, **kwargs):
    raise AssertionError("torch.profiler used while profiling is off")


def no_profiler(monkeypatch) -> None:
    for module in (torch.profiler, torch.autograd.profiler):
        monkeypatch.setattr(module, "record_function", _forbidden)
        monkeypatch.setattr(module, "profile", _forbidden)


def test_off_by_default_no_profiler_object_and_no_range(tiny_llm, monkeypatch):
    no_profiler(monkeypatch)
    before = tiny_llm.step_timing()
    generate(tiny_llm)
    engine = tiny_llm.engine
    assert engine.trace is None and engine.step_timer.ranges is None
    spent = tiny_llm.step_timing().minus(before)  # the steps were timed all the same
    assert spent.steps["prefill"].count >= 1 and spent.steps["decode"].count >= 5
    for kind in STEP_KINDS:
        phases = sum(spent.phases[kind, p].total for p in STEP_PHASES)
        assert all(spent.phases[kind, p].count == spent.steps[kind].count for p in STEP_PHASES)
        assert phases <= spent.steps[kind].total * (1 + 1e-9)
    assert spent.phases["decode", "forward"].total > 0


def test_a_trace_names_the_phases_and_layers_and_is_removed_after(tiny_llm, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    tiny_llm.start_profile(str(tmp_path / "traces"))
    with pytest.raises(ProfilerStateError, match="already running"):
        tiny_llm.start_profile(str(tmp_path))
    generate(tiny_llm, n=3)
    files = tiny_llm.stop_profile()
    events = json.loads(open(files.trace).read())["traceEvents"]
    names = {e.get("name") for e in events}
    layers = {f"layer.{i}" for i in range(tiny_llm.engine.model_config.num_layers)}
    assert PHASE_RANGES | layers | {"embedding", "final_norm", "lm_head"} <= names
    assert files.steps >= 3 and "inferd.forward" in open(files.ops_table).read()
    with pytest.raises(ProfilerStateError, match="no trace"):
        tiny_llm.stop_profile()
    model = tiny_llm.engine.runner.model
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    no_profiler(monkeypatch)  # the instrumentation is gone: a plain run touches no profiler
    generate(tiny_llm, n=2)


def test_a_trace_stops_itself_at_its_step_limit(tiny_llm, tmp_path, monkeypatch):
    import inferd.profiling.trace as trace

    monkeypatch.setattr(trace, "DEFAULT_MAX_STEPS", 2)
    tiny_llm.start_profile(str(tmp_path))
    generate(tiny_llm, n=4)
    assert tiny_llm.engine.trace is None  # ended after 2 steps; the files are written
    files = tiny_llm.stop_profile()
    assert files.steps == 2 and json.loads(open(files.trace).read())["traceEvents"]


def test_an_unwritable_directory_is_refused(tiny_llm, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="profiler directory"):
        tiny_llm.start_profile(str(blocker / "traces"))
    assert tiny_llm.engine.trace is None


class Recorder:
    def __init__(self) -> None:
        self.names: list[str] = []

    @contextmanager
    def __call__(self, name: str):
        self.names.append(name)
        yield


def test_c_kernels_and_c_decoder_layers_are_named(tmp_path, monkeypatch, c_kernels):
    from tiny_gguf import LAYERS, write_tiny_gguf

    from inferd.attention.cpu_backend import CpuAttentionBackend
    from inferd.engine.execution.runner import ModelRunner, SequenceStep
    from inferd.loader.checkpoint import open_checkpoint
    from inferd.loader.model_loader import load_model

    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), "gguf")
    runner = ModelRunner(model, [16], 16, torch.float32, torch.device("cpu"),
                         CpuAttentionBackend(c_kernels))  # fmt: skip
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 500, 8)]
    runner.execute([SequenceStep(ids, 0, [[1]])])  # the prefill (the C decoder too)
    record = Recorder()
    patches = instrument_model(runner, record)
    runner.execute([SequenceStep([3], 8, [[1]])])  # a decode step: the C decoder
    layers = [f"layer.{i}" for i in range(LAYERS)]
    assert [n for n in record.names if n.startswith("layer.")] == layers
    assert record.names.count("inferd_decode_layer") == LAYERS
    assert "inferd_block_gemv" in record.names and "lm_head" in record.names
    patches.restore()
    record.names.clear()
    runner.execute([SequenceStep([4], 9, [[1]])])
    assert record.names == []
    assert "run_layer" not in vars(model.cpu_decoder)
    assert not model.cpu_decoder.layer_by_layer  # untraced: all layers in one call again
    assert runner.backend.lib is c_kernels
