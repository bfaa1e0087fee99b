"""The engine core's OpenMP spin count (engine/transport/core_spin.py): a spawned child gets it
unless the user set one of libgomp's knobs, and the parent's environment is left as it was."""

from __future__ import annotations

import multiprocessing

import pytest

from inferd.engine.transport.core_spin import (
    CORE_SPIN_COUNT,
    SPIN_COUNT_ENV,
    USER_KNOBS,
    core_spin_count,
)


def _report(queue, names) -> None:
    import os

    queue.put({name: os.environ.get(name) for name in names})


def _child_environment() -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with core_spin_count():
        child = ctx.Process(target=_report, args=(queue, USER_KNOBS))
        child.start()
    try:
        return queue.get(timeout=60)
    finally:
        child.join(60)


@pytest.fixture
def no_knobs(monkeypatch):
    for name in USER_KNOBS:
        monkeypatch.delenv(name, raising=False)


def test_a_spawned_core_gets_the_short_spin_and_the_parent_keeps_its_environment(no_knobs):
    import os

    seen = _child_environment()
    assert seen[SPIN_COUNT_ENV] == CORE_SPIN_COUNT
    assert seen["OMP_WAIT_POLICY"] is None
    assert SPIN_COUNT_ENV not in os.environ


@pytest.mark.parametrize(("name", "value"), [("GOMP_SPINCOUNT", "123"),
                                             ("OMP_WAIT_POLICY", "passive")])  # fmt: skip
def test_a_users_own_knob_wins(no_knobs, monkeypatch, name, value):
    import os

    monkeypatch.setenv(name, value)
    with core_spin_count() as given:
        assert given is None
        assert os.environ[name] == value
    seen = _child_environment()
    assert seen[name] == value
    if name != SPIN_COUNT_ENV:
        assert seen[SPIN_COUNT_ENV] is None
    assert os.environ[name] == value
