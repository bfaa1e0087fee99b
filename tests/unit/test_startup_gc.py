"""The collector held while a command starts: off until the engine is built, on again after,
and on again even when the command fails before that."""

from __future__ import annotations

import gc

import pytest

from inferd.commands.startup_gc import engine_started, holding_collector


def test_held_until_the_engine_is_built_then_frozen_and_running():
    frozen_before = gc.get_freeze_count()
    try:
        with holding_collector():
            assert not gc.isenabled()
            engine_started()
            assert gc.isenabled()
            assert gc.get_freeze_count() > frozen_before
        assert gc.isenabled()
    finally:
        gc.unfreeze()  # give the test process its collector back as it was


def test_a_command_that_fails_early_gets_its_collector_back():
    with pytest.raises(ValueError), holding_collector():
        raise ValueError("bad flag")
    assert gc.isenabled()


def test_outside_a_held_start_nothing_changes():
    frozen_before = gc.get_freeze_count()
    engine_started()
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before
