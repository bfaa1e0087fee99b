"""Start-up progress: status lines on stderr (never stdout), silenced through logging levels."""

from __future__ import annotations

import logging

import pytest

from inferd import progress


@pytest.fixture(autouse=True)
def _restore_levels():
    loggers = [logging.getLogger(n) for n in (progress.LOGGER_NAME, "inferd", None)]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


def test_status_says_the_step_and_its_seconds_on_stderr(capsys):
    logging.getLogger(progress.LOGGER_NAME).setLevel(logging.NOTSET)
    logging.getLogger("inferd").setLevel(logging.NOTSET)
    with progress.status("building the tokenizer"):
        pass
    with progress.byte_progress("copying", 10) as advance:
        advance(10)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "inferd: building the tokenizer ..."
    assert lines[1].startswith("inferd: building the tokenizer: ") and lines[1].endswith(" s")
    assert lines[2] == "inferd: copying ..." and lines[3].startswith("inferd: copying: ")


def test_quiet_and_library_levels_silence_it(capsys):
    progress.set_quiet(True)  # what --quiet does
    with progress.status("step"):
        pass
    assert capsys.readouterr().err == ""
    progress.set_quiet(False)
    logging.getLogger(progress.LOGGER_NAME).setLevel(logging.NOTSET)
    logging.getLogger("inferd").setLevel(logging.WARNING)  # what a library user writes
    assert not progress.enabled()
    logging.getLogger("inferd").setLevel(logging.NOTSET)
    logging.getLogger().setLevel(logging.ERROR)  # the root level does not hide progress
    assert progress.enabled()


def test_a_failing_step_prints_no_finish_line(capsys):
    logging.getLogger(progress.LOGGER_NAME).setLevel(logging.INFO)
    with pytest.raises(RuntimeError), progress.status("compiling"):
        raise RuntimeError("no compiler")
    assert capsys.readouterr().err.splitlines() == ["inferd: compiling ..."]
