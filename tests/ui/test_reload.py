"""An experiment edited under a running `dagster dev` without "Reload".

`dagster dev` keeps the code location as it loaded it (the UI shows those versions), while
every run loads the file again. A real `dagster dev` on a temporary DAGSTER_HOME, runs
launched over its GraphQL API as the UI launches them.
"""

from __future__ import annotations

import json
import os
import sys
import time

import dagster as dg

from marin_dagster.execution.instance import ensure_home
from tests.conftest import REPO, free_port
from tests.ui.dagster_process import dagster_process, log_tail
from tests.ui.test_ui import graphql, wait_for_webserver

EXPERIMENT = """\
from assets import dataset

notes = dataset("raw/notes", {source!r})
"""
LAUNCH = """
mutation {{
  launchRun(executionParams: {{
    selector: {{repositoryLocationName: "{location}", repositoryName: "{repository}",
                jobName: "__ASSET_JOB", assetSelection: [{{path: ["raw", "notes_raw"]}}]}}
  }}) {{
    __typename
    ... on LaunchRunSuccess {{ run {{ runId }} }}
    ... on PythonError {{ message }}
  }}
}}
"""


def _launch(base: str, repo: str, home: str) -> list[str]:
    """Launch the asset as the UI's Materialize does; the run's warnings once it succeeds."""
    repository, location = repo.split("@")
    answer = graphql(base, LAUNCH.format(location=location, repository=repository))["launchRun"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    run_id = answer["run"]["runId"]
    deadline = time.time() + 300
    with dg.DagsterInstance.from_config(home) as instance:
        while not instance.get_run_by_id(run_id).is_finished:
            assert time.time() < deadline, "the run did not finish"
            time.sleep(1)
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS
        return [
            e.user_message
            for e in instance.all_logs(run_id)
            if e.level >= 30 and "loaded version" in e.user_message
        ]


def test_a_run_of_an_edited_experiment_says_to_reload(tmp_path):
    home = ensure_home(str(tmp_path / "dagster_home"))
    for folder, text in (("a", "first notes"), ("b", "second notes, other words")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "notes.jsonl").write_text(json.dumps({"text": text}) + "\n")
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT.format(source=str(tmp_path / "a")))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = str(tmp_path / "dagster_dev.log")
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    args = [dagster, "dev", "-f", str(exp), "-h", "127.0.0.1", "-p", str(port)]
    env = {"DAGSTER_HOME": home, "MARIN_PREFIX": str(tmp_path / "data")}
    with dagster_process(args, log, cwd=REPO, **env) as proc:
        repo = wait_for_webserver(base, proc, log)
        assert _launch(base, repo, home) == [], log_tail(log)

        exp.write_text(EXPERIMENT.format(source=str(tmp_path / "b")))  # no Reload
        (warning,) = _launch(base, repo, home)
        assert "raw/notes: this run loaded version" in warning
        assert "Reload the code location" in warning
    built = sorted(p.name for p in (tmp_path / "data" / "raw").iterdir())
    assert len(built) == 2, built  # the run built the file as it is now, under its version
