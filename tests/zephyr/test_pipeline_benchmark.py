"""benchmarks/zephyr_pipeline.py refuses a --datatrove-python without datatrove before it runs."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "zephyr_pipeline.py")


def test_a_python_without_datatrove_is_refused_at_once(tmp_path):
    work, cache = tmp_path / "work", tmp_path / "shk"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--mb", "1", "--rounds", "1", "--work", str(work)]
        + ["--shakespeare-cache", str(cache), "--datatrove-python", sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--datatrove-python {sys.executable}: cannot import datatrove" in proc.stderr
    assert "pip install datatrove" in proc.stderr, proc.stderr
    # Refused before the corpus is built or any contender runs.
    assert not work.exists() and not cache.exists(), proc.stdout
