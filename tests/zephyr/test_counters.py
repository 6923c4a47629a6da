"""Counters aggregate across workers; shared objects reach each worker once; progress events."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from marin_dagster.zephyr import Dataset, ZephyrContext, counters, get_shared
from tests.conftest import REPO, subprocess_env


def test_user_and_builtin_counters_aggregate(any_ctx: ZephyrContext) -> None:
    def count(items, info):
        n = 0
        for x in items:
            counters.increment("seen")
            counters.increment("pid_" + str(os.getpid()), 0)
            n += 1
            yield x
        counters.increment("per_shard", n)

    ds = Dataset.from_list(list(range(100))).reshard(4).map_shard(count).filter(lambda x: x % 2)
    result = any_ctx.execute(ds)
    c = result.counters
    assert c["seen"] == 100 and c["records_in"] == 100 and c["records_out"] == 50
    s = c.stats("per_shard")
    assert (s.sum, s.max, s.min, s.mean, s.tasks) == (100, 25, 25, 25.0, 4)
    assert len([k for k in c if k.startswith("pid_")]) == 2, "tasks ran on both workers"
    flat = c.as_dict()
    assert flat["per_shard"] == 100 and flat["per_shard/max"] == 25 and flat["records_out"] == 50
    assert counters.get_counters() == {}  # outside a task: nothing, and increment is a no-op
    counters.increment("ignored")


class _CountsUnpickling:
    """Leaves a file behind each time a process unpickles it."""

    def __init__(self, folder: str, payload: list[int]):
        self.folder, self.payload = folder, payload

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        open(
            os.path.join(self.folder, f"load-{os.getpid()}-{len(os.listdir(self.folder))}"), "w"
        ).close()


def test_shared_object_loaded_once_per_worker(tmp_path) -> None:
    folder = tmp_path / "loads"
    folder.mkdir()
    with ZephyrContext(max_workers=2) as ctx:
        ctx.upload_shared("big", _CountsUnpickling(str(folder), list(range(10_000))))
        ds = (
            Dataset.from_list(list(range(40)))
            .reshard(8)
            .map(lambda x: x + len(get_shared("big").payload))
        )
        assert ctx.execute(ds).results == [x + 10_000 for x in range(40)]
        assert ctx.execute(ds).results[0] == 10_000
    loads = os.listdir(folder)
    assert 1 <= len(loads) <= 2, loads  # 16 tasks, at most one load per worker process
    assert len({f.split("-")[1] for f in loads}) == len(loads)


def test_progress_events(local_ctx: ZephyrContext) -> None:
    events = []
    ctx = ZephyrContext(backend="inline", progress=events.append)
    ctx.execute(
        Dataset.from_list(list(range(10))).reshard(3).group_by(lambda x: x % 2, lambda k, i: k)
    )
    assert [(e.stage_index, e.completed, e.total) for e in events] == [
        (0, 0, 3),
        (0, 1, 3),
        (0, 2, 3),
        (0, 3, 3),
        (1, 0, 3),
        (1, 1, 3),
        (1, 2, 3),
        (1, 3, 3),
    ]
    assert events[-1].done and "3/3 shards" in str(events[-1])


PIPELINE = (
    "from marin_dagster.zephyr import Dataset, ZephyrContext\n"
    "ZephyrContext(backend='inline').execute("
    "Dataset.from_list(list(range(40))).reshard(4).map(lambda x: x + 1))\n"
)


def _stderr_of(on_terminal: bool) -> str:
    """Run a small pipeline with stderr on a pseudo-terminal (as in a shell) or on a pipe."""

    if not on_terminal:
        return subprocess.run(
            [sys.executable, "-c", PIPELINE],
            cwd=REPO,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stderr

    master, slave = pty.openpty()
    # A terminal window of 100 columns: on a 0-column pty tqdm draws nothing.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-c", PIPELINE],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the terminal closes when the process exits
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_a_progress_bar_on_a_terminal_and_none_in_a_pipe() -> None:
    shown = _stderr_of(on_terminal=True)
    assert "zephyr stage 0" in shown and "/4 [" in shown and "shard/s" in shown, shown
    assert "shard/s" not in _stderr_of(on_terminal=False)
