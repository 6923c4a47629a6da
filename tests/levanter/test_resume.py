"""A training process killed with SIGKILL resumes from its latest checkpoint, bitwise identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import subprocess_env
from tests.levanter.caches import write_cache

VOCAB = 50
STEPS = 30


def _run(spec: dict, env: dict[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.levanter.train_job", json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _finished_steps(out: str) -> list[int]:
    ckpt = os.path.join(out, "checkpoints")
    # Orbax writes a step under a temporary name and renames it when complete.
    return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit()) if os.path.isdir(ckpt) else []


@pytest.mark.slow
def test_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path) -> None:
    data = write_cache(str(tmp_path / "cache"), VOCAB, 8000, period=5)
    other = write_cache(str(tmp_path / "noise"), VOCAB, 4000, seed=3)
    base = {
        "datasets": {data: 1.0, other: 0.5},
        "steps": STEPS,
        "vocab": VOCAB,
        "checkpoint_every_steps": 4,
    }
    # Three processes compile the same step function: share XLA's compilation cache.
    env = subprocess_env(
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )

    whole = _finish(
        _run({**base, "runs": [{"output": str(tmp_path / "whole")}], "log_every": 10}, env)
    )

    killed_out = str(tmp_path / "killed")
    proc = _run({**base, "runs": [{"output": killed_out}], "sleep_per_step": 0.15}, env)
    deadline = time.time() + 240
    while not [s for s in _finished_steps(killed_out) if s >= 8]:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _finished_steps(killed_out)
    assert proc.returncode == -signal.SIGKILL
    assert max(at_kill) < STEPS and not os.path.exists(
        os.path.join(killed_out, "train_result.json")
    )

    resumed = _finish(_run({**base, "runs": [{"output": killed_out}], "log_every": 10}, env))
    assert resumed["result"]["resumed_from_step"] >= max(at_kill)
    assert resumed["result"]["final_step"] == STEPS

    a = np.load(os.path.join(tmp_path, "whole", "params.npz"))
    b = np.load(os.path.join(killed_out, "params.npz"))
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k  # bitwise
    # The metrics file tells one continuous story, equal to the uninterrupted run's.
    assert resumed["losses"] == whole["losses"] and len(whole["losses"]) == STEPS
