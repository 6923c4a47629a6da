"""A multi-process step's processes live and die together (`ProcessGang`), real processes."""

from __future__ import annotations

import signal
import sys
import time

from marin_dagster.iris.processes import ProcessGang, start_process_group


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _gang(*codes: str) -> ProcessGang:
    return ProcessGang([start_process_group(_py(c), {}) for c in codes])


SLEEP = "import time; time.sleep(60)"


def test_a_dead_follower_takes_the_leader_with_it():
    gang = _gang(SLEEP, SLEEP, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert gang.wait(timeout=20) == -signal.SIGKILL
    assert gang.failed_process == 2
    assert all(p.poll() is not None for p in gang.procs)


def test_the_leader_ending_ends_the_gang_and_a_finished_follower_is_waited_out():
    gang = _gang("import time; time.sleep(1.5)", "pass", SLEEP)
    time.sleep(0.7)
    assert gang.poll() is None  # follower 1 exited 0: the gang waits for the leader
    assert gang.wait(timeout=20) == 0 and gang.failed_process is None
    assert gang.procs[2].poll() == -signal.SIGKILL  # the follower still running was stopped


def test_a_preempted_leader_and_stop():
    gang = _gang("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", SLEEP)
    assert gang.wait(timeout=20) == -signal.SIGTERM and gang.failed_process == 0
    running = _gang(SLEEP, SLEEP)
    running.stop(grace_seconds=1.0)
    assert all(p.poll() is not None for p in running.procs)


def test_the_first_death_is_the_cause():
    """A preempted host (SIGTERM), then the leader failing in its collective a moment later:
    the gang ends as preempted, blaming the host."""
    gang = _gang(
        "import os, time; time.sleep(1.0); os._exit(75)",
        "import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGTERM)",
    )
    assert gang.wait(timeout=20) == -signal.SIGTERM and gang.failed_process == 1
