"""LLM.generate hands the heap's free pages back once a run ends, finished or failed (the
offline twin of AsyncEngine's trim on going idle), on a scripted engine."""

from __future__ import annotations

import itertools

import pytest

import inferd.llm as llm_module
from inferd.llm import LLM
from inferd.outputs import RequestOutput


class ScriptedEngine:
    """Finishes every request on the first step; `fail` makes that step raise instead."""

    def __init__(self, trims: list[str], fail: bool = False):
        self.trims, self.fail = trims, fail
        self.pending: list[str] = []
        self.aborted: list[str] = []

    def check_grammar(self, params) -> None:
        pass

    def add_request(self, request_id, prompt, params) -> None:
        self.pending.append(request_id)

    def abort_request(self, request_id) -> None:
        self.aborted.append(request_id)
        self.pending.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[RequestOutput]:
        self.trims.append("step")  # the trim must come after the steps, not between them
        if self.fail and self.pending:
            raise RuntimeError("a step failed")
        done, self.pending = self.pending, []
        return [RequestOutput(i, None, [1], [], finished=True) for i in done]


def scripted_llm(engine: ScriptedEngine) -> LLM:
    llm = LLM.__new__(LLM)  # no model: the engine is scripted
    llm.engine, llm._ids = engine, itertools.count()
    return llm


@pytest.fixture
def trims(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(llm_module, "_TRIM", lambda pad: calls.append(f"trim {pad}") or 1)
    return calls


def test_a_finished_run_trims_once_after_its_steps(trims):
    outs = scripted_llm(ScriptedEngine(trims)).generate(["a", "b"], use_tqdm=False)
    assert [o.request_id for o in outs] == ["offline-0", "offline-1"]
    assert trims == ["step", "trim 0"]


def test_a_failed_run_trims_too(trims):
    engine = ScriptedEngine(trims, fail=True)
    with pytest.raises(RuntimeError, match="a step failed"):
        scripted_llm(engine).generate(["a"], use_tqdm=False)
    assert engine.aborted == ["offline-0"]
    assert trims[-1] == "trim 0" and trims.count("trim 0") == 1


def test_without_glibc_nothing_is_called(monkeypatch):
    monkeypatch.setattr(llm_module, "_TRIM", None)
    outs = scripted_llm(ScriptedEngine([])).generate(["a"], use_tqdm=False)
    assert len(outs) == 1
