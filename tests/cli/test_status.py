"""`marin status` on what a newcomer meets: a killed run, a changed config, and a DAGSTER_HOME
without dagster.yaml (the README's "Other ways in")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg

from marin_dagster import fs
from marin_dagster.execution.instance import ensure_home
from marin_dagster.execution.status import LOCK_FILE, StatusRecord, StepStatus, write_status
from marin_dagster.execution.step import execute_step
from tests.cli.test_cli import add_orphaned_run, in_process
from tests.conftest import REPO, subprocess_env

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")

EXPERIMENT = """
from assets import dataset

notes = dataset("raw/notes", {source!r})
"""

# Takes the output's lease, as a step does, says so, and works until it is killed.
HOLDER = """
import pathlib, sys, time
from marin_dagster.execution.step import execute_step

path, version, ready = sys.argv[1:]

def work(out):
    pathlib.Path(ready).touch()
    time.sleep(600)

execute_step(path, version, work)
"""


def _experiment(tmp_path, name: str, records: int) -> str:
    """An experiment file of one dataset asset, "raw/notes"; `records` sets its version."""
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps({"text": f"note {i}"}) + "\n" for i in range(records)))
    exp = tmp_path / f"{name}.py"
    exp.write_text(EXPERIMENT.format(source=str(source)))
    return str(exp)


def _status(capsys, monkeypatch, exp: str, env: dict[str, str]) -> tuple[dict, str]:
    code, out, err = in_process(capsys, monkeypatch, "status", "--json", "-f", exp, env=env)
    assert code == 0, err
    return {r["asset"]: r for r in json.loads(out)}["raw/notes"], err


def test_a_killed_run_shows_as_interrupted_and_a_rerun_takes_over(tmp_path, capsys, monkeypatch):
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": ensure_home(str(tmp_path / "h"))}
    exp = _experiment(tmp_path, "notes", 5)
    row, _ = _status(capsys, monkeypatch, exp, env)
    path, version = row["output"], row["version"]
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path, version, str(ready)], env=subprocess_env(), cwd=REPO
    )
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert holder.poll() is None and time.time() < deadline, "the holder did not start"
            time.sleep(0.1)
        row, err = _status(capsys, monkeypatch, exp, env)
        assert row["status"] == "RUNNING" and "interrupted" not in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    row, err = _status(capsys, monkeypatch, exp, env)
    assert row["status"] == "interrupted"
    assert "the run writing the output ended without recording its end" in err
    assert "its last status write failed" in err and "resumes" in err
    outcome = execute_step(path, version, lambda out: {})  # what the next run does
    assert not outcome.skipped
    row, err = _status(capsys, monkeypatch, exp, env)
    assert row["status"] == "SUCCESS" and "interrupted" not in err


def test_a_lease_from_another_host_is_judged_by_its_heartbeat(tmp_path, capsys, monkeypatch):
    """A holder elsewhere cannot be asked whether it lives: a heartbeat older than the stale
    limit (90 s) says it is gone."""
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": ensure_home(str(tmp_path / "h"))}
    exp = _experiment(tmp_path, "notes", 5)
    row, _ = _status(capsys, monkeypatch, exp, env)
    write_status(row["output"], StatusRecord(StepStatus.RUNNING, row["version"]))
    for age, expected in ((5, "RUNNING"), (200, "interrupted")):
        lock = {"token": "t", "run_id": "r", "host": "elsewhere", "pid": 1}
        fs.write_json(
            fs.join(row["output"], LOCK_FILE), {**lock, "heartbeat_at": time.time() - age}
        )
        assert _status(capsys, monkeypatch, exp, env)[0]["status"] == expected
    # A holder configured with a longer limit (StorageResource.stale_after_s) says so in its
    # lease, and is judged by it: 200 s is within its 600 s.
    lock = {**lock, "heartbeat_at": time.time() - 200, "stale_after_s": 600}
    fs.write_json(fs.join(row["output"], LOCK_FILE), lock)
    assert _status(capsys, monkeypatch, exp, env)[0]["status"] == "RUNNING"


def test_history_without_dagster_yaml_and_only_this_versions_materialization(
    tmp_path, capsys, monkeypatch
):
    """DAGSTER_HOME a bare folder, as `export DAGSTER_HOME=...` and the dagster CLI leave it:
    Dagster keeps its history there, and `marin status` reads it. The last materialization
    is the version's own at this prefix: a new version, or another prefix, has none yet."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": str(home)}
    first, second = _experiment(tmp_path, "v1", 5), _experiment(tmp_path, "v2", 6)

    def materialize() -> subprocess.CompletedProcess:
        return subprocess.run(
            [DAGSTER, "asset", "materialize", "-f", first, "--select", "raw/notes_raw"],
            cwd=REPO,
            env=subprocess_env(**env, PYTHONWARNINGS="ignore::FutureWarning"),
            capture_output=True,
            text=True,
            timeout=600,
        )

    done = materialize()
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (home / "dagster.yaml").exists()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        orphan = add_orphaned_run(instance, "notes_job")

    row, err = _status(capsys, monkeypatch, first, env)
    assert row["status"] == "SUCCESS" and row["last materialization"].endswith(
        f"(run {run.run_id[:8]})"
    )
    assert f"marked 1 run(s) whose process on this host is gone as failed: {orphan}" in err
    assert "no Dagster run history" not in err and "dagster.yaml" not in err
    # A run that skips it materializes it too; the run shown is still the one that built it.
    again = materialize()
    assert again.returncode == 0 and "skipping" in again.stderr, again.stderr[-3000:]
    row, _ = _status(capsys, monkeypatch, first, env)
    assert row["last materialization"].endswith(f"(run {run.run_id[:8]})"), row

    row, _ = _status(capsys, monkeypatch, second, env)
    assert row["status"] == "missing" and row["last materialization"] == "-"
    # the same version under another prefix, with the same Dagster home: not materialized
    elsewhere = {**env, "MARIN_PREFIX": str(tmp_path / "elsewhere")}
    row, _ = _status(capsys, monkeypatch, first, elsewhere)
    assert row["status"] == "missing" and row["last materialization"] == "-"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_run_by_id(orphan).status == dg.DagsterRunStatus.FAILURE


def test_without_history_status_says_why(tmp_path, capsys, monkeypatch):
    exp = _experiment(tmp_path, "notes", 5)
    empty = tmp_path / "empty_home"
    empty.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for home, why in (
        (tmp_path / "nowhere", f"DAGSTER_HOME={tmp_path / 'nowhere'} does not exist"),
        (a_file, f"DAGSTER_HOME={a_file} is a file, not a folder"),
        (empty, f"DAGSTER_HOME={empty} holds no dagster.yaml and no history/ yet"),
    ):
        env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": str(home)}
        row, err = _status(capsys, monkeypatch, exp, env)
        assert row["last materialization"] == "-"
        assert f"marin status: no Dagster run history: {why}" in err, err
        assert "marin init" in err
    assert os.listdir(empty) == [], "status only reads: it creates no instance"


def test_storage_that_does_not_answer_is_said_in_one_line(tmp_path) -> None:
    """gs:// with its server down: `marin status` printed 50 lines of aiohttp traceback after
    gcsfs's retries (about 35 s here)."""
    import socket
    import subprocess

    from tests.conftest import subprocess_env

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    marin = os.path.join(os.path.dirname(sys.executable), "marin")
    done = subprocess.run(
        [marin, "status", "--prefix", "gs://nowhere/data"],
        env=subprocess_env(
            STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}", DAGSTER_HOME=str(tmp_path)
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "marin status: cannot reach the storage of gs://nowhere/data" in done.stderr
    assert "STORAGE_EMULATOR_HOST" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_experiment_in_a_package_loads_as_dagster_loads_it(tmp_path, capsys, monkeypatch):
    """Marin's layout: experiments/exp.py imports `experiments.defaults`, run from the folder
    above. `dagster ... -f experiments/exp.py` loads it (its working directory is importable);
    `marin status -f` failed with a traceback: No module named 'experiments'."""
    package = tmp_path / "proj" / "marin_pkg_exps"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = tmp_path / "notes.jsonl"
    source.write_text(json.dumps({"text": "a note"}) + "\n")
    (package / "defaults.py").write_text(f"SOURCE = {str(source)!r}\n")
    (package / "exp.py").write_text(
        "from assets import dataset\n"
        "from marin_pkg_exps.defaults import SOURCE\n"
        "notes = dataset('raw/notes', SOURCE)\n"
    )
    (package / "broken.py").write_text("from marin_pkg_exps.nowhere import SOURCE\n")
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.setattr(sys, "path", list(sys.path))
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": ensure_home(str(tmp_path / "h"))}
    try:
        row, _ = _status(capsys, monkeypatch, "marin_pkg_exps/exp.py", env)
        assert row["status"] == "missing"
        code, _, err = in_process(
            capsys, monkeypatch, "status", "-f", "marin_pkg_exps/broken.py", env=env
        )
        assert code == 2 and "Traceback" not in err
        assert (
            "marin status: -f marin_pkg_exps/broken.py: ModuleNotFoundError: No module named "
            f"'marin_pkg_exps.nowhere' (imports resolve from the file's folder and from "
            f"{tmp_path / 'proj'}" in err
        ), err
    finally:
        for name in [m for m in sys.modules if m.startswith("marin_pkg_exps")]:
            del sys.modules[name]
