"""execute_step: a step's failure is what the user sees, whatever else fails with it."""

from __future__ import annotations

import logging
import os

import pytest

from marin_dagster.execution.status import STATUS_FILE, read_status
from marin_dagster.execution.step import execute_step


def test_a_status_write_that_fails_too_does_not_hide_the_steps_error(tmp_path, caplog):
    """When the step's error also breaks writing FAILED (a full disk breaks both), the
    step's own error is raised, and the failed status write is a warning."""
    out = str(tmp_path / "step-00000000")

    def work(path: str) -> None:
        # a real OS error for the FAILED write: its target is now a folder
        os.remove(os.path.join(path, STATUS_FILE))
        os.mkdir(os.path.join(path, STATUS_FILE))
        raise ValueError("the step's own error")

    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="step's own error"):
        execute_step(out, "00000000", work)
    assert "could not record the step's failure" in caplog.text
    assert not os.path.exists(os.path.join(out, ".lock.json"))  # the next run takes over


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (KeyboardInterrupt(), "KeyboardInterrupt: the run was stopped (Ctrl-C, or Terminate)"),
        (ValueError("bad field"), "ValueError: bad field"),
        (RuntimeError(), "RuntimeError"),
    ],
)
def test_the_failed_status_says_what_stopped_the_step(tmp_path, error, recorded):
    out = str(tmp_path / "step-00000000")

    def work(path: str) -> None:
        raise error

    with pytest.raises(type(error)):
        execute_step(out, "00000000", work)
    assert read_status(out).error == recorded
