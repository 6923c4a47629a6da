"""A real daemon tick: `dagster-daemon run` evaluates the sensor and creates the run it requests."""

from __future__ import annotations

import os
import sys
import time

import dagster as dg

from marin_dagster.datasets.watch import content_hash, file_digest
from marin_dagster.execution.tags import CONTENT_TAG, WATCH_TAG
from tests.conftest import REPO
from tests.ui.dagster_process import dagster_process, log_tail

WORKSPACE = """\
load_from:
  - python_file:
      relative_path: {location}
      working_directory: {repo}
"""


def test_daemon_requests_a_run_when_files_arrive(tmp_path, dagster_home):
    folder, prefix = tmp_path / "inbox", tmp_path / "data"
    folder.mkdir()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        WORKSPACE.format(location=os.path.join(REPO, "tests", "sensors", "location.py"), repo=REPO)
    )
    log = str(tmp_path / "daemon.log")
    daemon = os.path.join(os.path.dirname(sys.executable), "dagster-daemon")
    with dagster_process(
        [daemon, "run", "-w", str(workspace)],
        log,
        cwd=str(tmp_path),
        DAGSTER_HOME=dagster_home,
        MARIN_PREFIX=str(prefix),
        MARIN_WATCHED_DIR=str(folder),
    ) as proc:
        for i in range(20):
            (folder / f"scene{i}.txt").write_text(f"Enter ghost {i}.\n")
        with dg.DagsterInstance.get() as instance:
            deadline = time.time() + 150
            runs = []
            while not runs and time.time() < deadline and proc.poll() is None:
                runs = instance.get_runs(
                    filters=dg.RunsFilter(tags={WATCH_TAG: "inbox__raw__inbox_sensor"})
                )
                time.sleep(0.5)
            assert runs, f"no run was requested; daemon log:\n{log_tail(log)}"
            time.sleep(3)  # later ticks see the same content: no second run
            runs = instance.get_runs(
                filters=dg.RunsFilter(tags={WATCH_TAG: "inbox__raw__inbox_sensor"})
            )
    assert len(runs) == 1, [r.tags for r in runs]
    run = runs[0]
    assert run.job_name == "inbox_job"
    assert run.asset_selection == {dg.AssetKey(["raw", "inbox_corpus_raw"])}
    expected = content_hash(
        {f"scene{i}.txt": file_digest(str(folder / f"scene{i}.txt")) for i in range(20)}
    )
    assert run.tags[CONTENT_TAG] == expected and "marin/force" not in run.tags
