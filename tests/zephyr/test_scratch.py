"""Scratch folders of a killed driver are removed by the next context, never a live one's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

from marin_dagster.zephyr import Dataset, ZephyrContext

# A driver that makes its scratch folder, fills it (a shuffle's spill), reports it and
# waits to be killed: kill -9 runs no cleanup, as when Iris stops a step whose run died.
_DRIVER = textwrap.dedent(
    """
    import os, sys
    from marin_dagster.zephyr import ZephyrContext
    ctx = ZephyrContext(max_workers=1, scratch_dir=sys.argv[1])
    with open(os.path.join(ctx._scratch_root, "spill.arrow"), "wb") as f:
        f.write(b"x" * 100_000)
    print(ctx._scratch_root, flush=True)
    sys.stdin.read()
    """
)


def _driver(scratch_dir: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, scratch_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, proc.stdout.readline().strip()


def test_next_context_removes_a_killed_drivers_scratch(tmp_path) -> None:
    killed, killed_root = _driver(str(tmp_path))
    alive, alive_root = _driver(str(tmp_path))
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert os.path.isdir(killed_root), "kill -9 leaves the folder (nothing ran)"
        ctx = ZephyrContext(max_workers=1, scratch_dir=str(tmp_path))
        try:
            assert not os.path.exists(killed_root), "the dead driver's scratch is removed"
            assert os.path.exists(os.path.join(alive_root, "spill.arrow")), (
                "a live driver's scratch is kept"
            )
            # and a third context leaves this live one's folder alone too
            with ZephyrContext(max_workers=1, scratch_dir=str(tmp_path)):
                assert os.path.isdir(ctx._scratch_root)
        finally:
            ctx.shutdown()
        assert not os.path.exists(ctx._scratch_root)
        ctx.shutdown()  # twice is harmless (the lock's descriptor is closed once)
    finally:
        alive.stdin.close()
        alive.wait()
    assert sorted(os.listdir(tmp_path)) == [], "a driver that exits removes its own"


def test_folder_without_owner_file_is_left_alone(tmp_path) -> None:
    # Being made right now by another context, or made by an older version: not ours to judge.
    other = tmp_path / "zephyr-other"
    other.mkdir()
    with ZephyrContext(max_workers=1, scratch_dir=str(tmp_path)):
        pass
    assert other.is_dir()


def _task_temp_file(_: int) -> str:
    # What a gs:// write does in a worker: spool the file locally, upload it at the end.
    fd, path = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
    return path


def test_worker_temp_files_live_in_the_scratch_folder(tmp_path) -> None:
    # A worker killed with its driver leaves its temporary files (kill -9 runs no finally):
    # inside the scratch folder, the next context removes them with it.
    with ZephyrContext(max_workers=1, scratch_dir=str(tmp_path)) as ctx:
        [path] = ctx.execute(Dataset.from_list([0]).map(_task_temp_file)).results
        assert path.startswith(ctx._scratch_root + os.sep)
    assert not os.path.exists(path)
