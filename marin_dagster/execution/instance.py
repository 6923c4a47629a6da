"""The persistent Dagster instance (sqlite under DAGSTER_HOME, default ./.dagster).

Without a persistent instance Dagster keeps no history, so the UI and CLI
would lose every run (and skipping by provenance with it).
"""

from __future__ import annotations

import os
import socket

import dagster as dg

from marin_dagster.execution.processes import process_gone, process_start_time
from marin_dagster.execution.tags import RUN_HOST_TAG, RUN_PID_TAG, RUN_PROCESS_START_TAG

DEFAULT_HOME = ".dagster"

DAGSTER_YAML = """\
# Written by `marin init`. Local sqlite storage under this folder.
telemetry:
  enabled: false
run_queue:
  max_concurrent_runs: 2
"""

NUX_YAML = "seen: 1\n"


class DagsterHomeError(OSError):
    """DAGSTER_HOME cannot be created or written; the message names the path and what to do."""


def ensure_home(home: str | None = None) -> str:
    """Create DAGSTER_HOME with its dagster.yaml if missing; returns the absolute path.

    Raises DagsterHomeError when the folder cannot be made or written.
    """
    home = os.path.abspath(home or os.environ.get("DAGSTER_HOME") or DEFAULT_HOME)
    try:
        os.makedirs(os.path.join(home, ".nux"), exist_ok=True)
        config = os.path.join(home, "dagster.yaml")
        if not os.path.exists(config):
            with open(config, "w") as f:
                f.write(DAGSTER_YAML)
        nux = os.path.join(home, ".nux", "nux.yaml")
        if not os.path.exists(nux):
            with open(nux, "w") as f:
                f.write(NUX_YAML)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and os.fspath(e.filename) != home else ""
        error = DagsterHomeError(
            f"cannot create the Dagster home {home}: {e.strerror or e}{where}; "
            "give a folder you can write, e.g. `marin init ./.dagster`, or set DAGSTER_HOME to one"
        )
        error.errno = e.errno
        raise error from e
    return home


def persistent_instance() -> dg.DagsterInstance:
    os.environ["DAGSTER_HOME"] = ensure_home()
    return dg.DagsterInstance.get()


def run_process_tags() -> dict[str, str]:
    """The tags naming this process as the driver of a run (see `fail_orphaned_runs`)."""
    tags = {RUN_PID_TAG: str(os.getpid()), RUN_HOST_TAG: socket.gethostname()}
    started = process_start_time(os.getpid())
    if started is not None:
        tags[RUN_PROCESS_START_TAG] = str(started)
    return tags


def _inherited(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether `run`'s process tags are its parent's: a re-execution copies the parent's tags,
    so a new run named the parent's finished process until its executor retagged it, and
    in between it looked orphaned."""
    if not run.parent_run_id:
        return False
    parent = instance.get_run_by_id(run.parent_run_id)
    return parent is not None and all(
        parent.tags.get(tag) == run.tags.get(tag)
        for tag in (RUN_PID_TAG, RUN_HOST_TAG, RUN_PROCESS_START_TAG)
    )


def fail_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """End the runs whose driving process on this host is gone; returns their run ids.

    A run whose process was killed outright never records its end and would stay STARTED
    (or CANCELING) forever. Only runs tagged by the Iris executor on this host are judged;
    a STARTED one is marked FAILURE, a CANCELING one CANCELED. Runs on other hosts, and runs
    without the tags, are left alone: from here nobody can tell whether they are alive.
    """
    host = socket.gethostname()
    ended = []
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING],
            tags={RUN_HOST_TAG: host},
        )
    )
    for run in runs:
        try:
            pid = int(run.tags[RUN_PID_TAG])
        except (KeyError, ValueError):
            continue
        started_tag = run.tags.get(RUN_PROCESS_START_TAG)
        started = int(started_tag) if started_tag and started_tag.isdigit() else None
        if not process_gone(pid, started) or _inherited(instance, run):
            continue
        message = (
            f"The process driving this run (pid {pid} on {host}) is gone: it was killed or "
            f"crashed before the run could record its end, so the run is marked "
            f"{'CANCELED' if run.status == dg.DagsterRunStatus.CANCELING else 'FAILED'}. Its "
            f"step outputs left RUNNING are taken over by the next run."
        )
        if run.status == dg.DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, message=message)
        else:
            instance.report_run_failed(run, message=message)
        ended.append(run.run_id)
    return ended
