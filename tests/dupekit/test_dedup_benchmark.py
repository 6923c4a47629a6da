"""benchmarks/dedup.py refuses a --datatrove-python it cannot use before it measures anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "dedup.py")


@pytest.mark.parametrize(
    ("python", "why"),
    [
        ("/nonexistent/bin/python", "no such file"),
        (sys.executable, "cannot import datatrove"),  # this environment has no datatrove
    ],
)
def test_an_unusable_datatrove_python_is_refused_at_once(tmp_path, python, why):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--docs", "10", "--cache", str(tmp_path / "cache")]
        + ["--datatrove-python", python],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--datatrove-python {python}: {why}" in proc.stderr, proc.stderr
    assert "pip install datatrove" in proc.stderr, proc.stderr
    # Refused before the corpus is built or any dupekit run is timed.
    assert "docs/s" not in proc.stdout and not os.path.exists(tmp_path / "cache"), proc.stdout
