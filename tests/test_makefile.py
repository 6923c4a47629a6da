"""The README's test command sets up what the suite needs itself: Debian's chromium for the
UI test is installed by `make test` (its `browser` target) when missing."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.conftest import REPO

MAKE = shutil.which("make")


def _make(*args: str, env: dict[str, str] | None = None, timeout: int = 60):
    return subprocess.run(
        [MAKE, "-s", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _browser(tmp_path, chromium: str, path: str) -> subprocess.CompletedProcess:
    return _make("browser", f"CHROMIUM={chromium}", env={"PATH": path, "HOME": str(tmp_path)})


def test_a_browser_already_there_is_used_as_it_is(tmp_path):
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    proc = _browser(tmp_path, str(present), os.environ["PATH"])
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc


def test_a_missing_browser_that_cannot_be_installed_is_a_clear_error(tmp_path):
    """No apt-get, no sudo, no id on PATH (an empty folder): make says what to do."""
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _browser(tmp_path, str(tmp_path / "missing" / "chromium"), str(empty))
    assert proc.returncode != 0
    assert "installing it with apt-get" in proc.stdout
    assert "apt-get install chromium" in proc.stderr and "make test again" in proc.stderr


def test_make_validate_loads_the_code_location_without_dagster_cli_warnings(tmp_path):
    # Not created beforehand: on a fresh checkout .dagster does not exist yet, and Dagster
    # refuses a DAGSTER_HOME that is missing, so the target makes it as `make demo` does.
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = _make("validate", f"DAGSTER_HOME={home}", env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Validation successful" in out
    assert "superseded" not in out and "Warning" not in out, out


def test_make_bench_runs_only_scripts_meant_to_be_run(tmp_path):
    """`make bench` runs each benchmark script; a module that is only imported (the training
    benchmark's peer) or a device check sized for a GPU is not one, and the first of them
    (baseline_llama.py, which fails when run as a script) stopped the target at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ran.txt"
    stub = bin_dir / "python"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    stub.chmod(0o755)
    proc = _make("bench", f"BIN={bin_dir}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [line.split()[0] for line in log.read_text().splitlines() if "benchmarks/" in line]
    assert ran, log.read_text()
    assert "benchmarks/baseline_llama.py" not in ran and "benchmarks/gpu_train_check.py" not in ran
    for script in ran:
        with open(os.path.join(REPO, script)) as f:
            assert 'if __name__ == "__main__":' in f.read(), script
