"""A rebuild at the same path (forced, or its inputs changed) keeps the output it replaces
until it succeeds: a failed rebuild puts it back, on local disk, memory:// and gs://."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from marin_dagster import fs
from marin_dagster.execution.lease import LeaseSettings
from marin_dagster.execution.status import (
    MANIFEST_FILE,
    PREVIOUS_DIR,
    StepStatus,
    read_status,
)
from marin_dagster.execution.step import execute_step
from tests.conftest import REPO, subprocess_env

VERSION = "aaaaaaaa"
FAST = LeaseSettings(heartbeat_s=0.2, stale_after_s=2.0, wait_s=30, poll_s=0.05, settle_s=0.1)


def _writes(*names: str, fail: str | None = None):
    def run(path: str) -> dict:
        for name in names:
            fs.write_text(fs.join(path, name), f"{name} of this build")
        if fail:
            raise RuntimeError(fail)
        return {"files": len(names)}

    return run


def _files(output: str) -> dict[str, str]:
    """The output's data files (not the status, manifest, lease or `.previous/`)."""
    fsys, root = fs.url_to_fs(output)
    root = root.rstrip("/")
    names = [p[len(root) + 1 :] for p in fsys.find(root)]
    return {
        name: fs.read_bytes(fs.join(output, name)).decode()
        for name in names
        if not any(part.startswith(".") for part in name.split("/"))
    }


def _built(prefix: str) -> tuple[str, dict[str, str], str]:
    output = fs.join(prefix, f"step-{VERSION}")
    execute_step(output, VERSION, _writes("a.txt", "sub/b.txt"), inputs={"source": "d1"})
    record = read_status(output)
    return output, _files(output), record.data_version


def test_a_failed_forced_rebuild_puts_the_output_back(prefix):
    output, files, data_version = _built(prefix)
    with pytest.raises(RuntimeError, match="bad input"):
        execute_step(output, VERSION, _writes("c.txt", fail="bad input"), force=True)
    record = read_status(output)
    assert record.status == StepStatus.SUCCESS and record.data_version == data_version
    assert _files(output) == files
    assert not fs.exists(fs.join(output, PREVIOUS_DIR))
    assert execute_step(output, VERSION, _writes("never.txt"), inputs={"source": "d1"}).skipped


def test_a_failed_rebuild_for_changed_inputs_puts_it_back_still_outdated(prefix):
    output, files, data_version = _built(prefix)
    with pytest.raises(RuntimeError):
        execute_step(output, VERSION, _writes("c.txt", fail="no"), inputs={"source": "d2"})
    record = read_status(output)
    assert record.data_version == data_version and record.inputs == {"source": "d1"}
    assert _files(output) == files
    # still built from the old input: the next run tries again
    outcome = execute_step(output, VERSION, _writes("c.txt"), inputs={"source": "d2"})
    assert not outcome.skipped and _files(output) == {"c.txt": "c.txt of this build"}


def test_a_rebuild_that_succeeds_leaves_only_its_own_files(prefix):
    output, _, data_version = _built(prefix)
    outcome = execute_step(output, VERSION, _writes("c.txt"), force=True)
    assert _files(output) == {"c.txt": "c.txt of this build"}
    assert not fs.exists(fs.join(output, PREVIOUS_DIR))
    assert set(fs.read_json(fs.join(output, MANIFEST_FILE))["files"]) == {"c.txt"}
    assert outcome.data_version != data_version


_KILLED_REBUILD = textwrap.dedent(
    """
    import sys, time
    from marin_dagster import fs
    from marin_dagster.execution.lease import LeaseSettings
    from marin_dagster.execution.step import execute_step

    output, ready = sys.argv[1], sys.argv[2]

    def run(path):
        fs.write_text(fs.join(path, "partial.txt"), "half of the new build")
        open(ready, "w").close()
        time.sleep(120)

    lease = LeaseSettings(heartbeat_s=0.2, stale_after_s=2.0)
    execute_step(output, "aaaaaaaa", run, force=True, lease=lease)
    """
)


def test_a_killed_rebuild_resumes_and_its_failure_still_puts_the_output_back(
    process_prefix, tmp_path
):
    """kill -9 in the middle of a forced rebuild: the output reads RUNNING (not finished),
    the next run resumes the rebuild, and when that fails the old output comes back."""
    output, files, data_version = _built(process_prefix)
    ready = str(tmp_path / "ready")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_REBUILD, output, ready],
        cwd=REPO,
        env=subprocess_env(),
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not os.path.exists(ready):
            assert proc.poll() is None and time.time() < deadline, "the rebuild never started"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert read_status(output).status == StepStatus.RUNNING
    assert _files(output) == {"partial.txt": "half of the new build"}

    seen: list[dict[str, str]] = []

    def resume(path: str) -> dict:
        seen.append(_files(path))  # what the resumed rebuild finds: its own partial files
        raise RuntimeError("still broken")

    with pytest.raises(RuntimeError, match="still broken"):
        execute_step(output, VERSION, resume, lease=FAST)
    assert seen == [{"partial.txt": "half of the new build"}]
    record = read_status(output)
    assert record.status == StepStatus.SUCCESS and record.data_version == data_version
    assert _files(output) == files and not fs.exists(fs.join(output, PREVIOUS_DIR))
