"""Experiment.materialize: what a script run binds."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from assets import Experiment, dataset
from resources.zephyr import ZephyrResource


def test_materialize_overrides_only_the_resources_given(tmp_path, monkeypatch) -> None:
    # A user choosing another Zephyr backend passes that resource alone; storage and the
    # rest stay the local ones (the prefix from MARIN_PREFIX).
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    raw = dataset("raw/override-notes", str(src))
    with dg.instance_for_test() as instance:
        result = Experiment("override", leaves=[raw]).materialize(
            resources={"zephyr": ZephyrResource(backend="inline", max_workers=1)},
            instance=instance,
        )
    assert result.success
    meta = result.asset_materializations_for_node(raw.op.name)[0].metadata
    assert meta["zephyr/backend"].value == "inline"
    assert list((tmp_path / "data" / "raw").glob("override-notes-*/.status.json"))


def test_a_script_run_says_it_places_no_accelerator_request(tmp_path, monkeypatch, caplog):
    """`python exp.py` ran a step asking for GPUs or several hosts in its own process, as
    asked for nothing: Marin's executor places steps by their resources."""
    import logging

    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    raw = dataset("raw/gpu-notes", str(src), resources="gpu:2 replicas=2")
    with dg.instance_for_test() as instance, caplog.at_level(logging.WARNING):
        assert Experiment("gpu_notes", leaves=[raw]).materialize(instance=instance).success
    assert (
        "runs every step in this process, on the devices it sees: raw/gpu-notes (gpu:2 "
        "replicas=2) asked for more, which only the Iris executor places" in caplog.text
    )


def test_a_run_that_fails_before_its_steps_says_why(tmp_path, monkeypatch) -> None:
    """Storage that cannot be written fails the run in a resource, before any step: the
    error said "its step(s) failed; ... the other steps ran", true of nothing, and named no
    error."""
    from assets.experiment import StepsFailedError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MARIN_PREFIX", str(blocker / "data"))
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    raw = dataset("raw/unwritable-notes", str(src))
    with dg.instance_for_test() as instance, pytest.raises(StepsFailedError) as err:
        Experiment("unwritable", leaves=[raw]).materialize(instance=instance)
    message = str(err.value)
    assert "failed before its steps ran (none did): resources.storage.StorageError: " in message
    assert f"storage prefix '{blocker / 'data'}' is not writable" in message
    assert "the other steps ran" not in message


def test_a_script_takes_executor_mains_flags(tmp_path) -> None:
    """`python exp.py --dry_run` ignored the flag and built everything; now materialize()
    called by the script Python runs reads Marin's flags, and refuses one it does not know."""
    import os
    import subprocess
    import sys

    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    script = tmp_path / "exp.py"
    script.write_text(
        "from assets import Experiment, dataset\n"
        f"raw = dataset('raw/flag-notes', {str(src)!r})\n"
        "experiment = Experiment('flags', leaves=[raw])\n"
        "if __name__ == '__main__':\n"
        "    experiment.materialize()\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "MARIN_PREFIX": str(tmp_path / "data"),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "PYTHONPATH": repo,
    }
    (tmp_path / "home").mkdir()

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), *flags], env=env, capture_output=True, text=True
        )

    dry = run("--dry_run")
    assert dry.returncode == 0, dry.stderr
    assert "run    raw/flag-notes-" in dry.stdout, dry.stdout
    assert not (tmp_path / "data").exists()  # nothing built
    bogus = run("--bogus")
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr
    built = run()
    assert built.returncode == 0, built.stderr
    assert list((tmp_path / "data" / "raw").glob("flag-notes-*/.status.json"))
    assert "skip   raw/flag-notes-" in run("--dry_run").stdout


def test_a_script_passing_resources_or_force_takes_the_flags_too(tmp_path) -> None:
    """materialize(resources=...) is how a script runs on Ray; with any flag (--dry_run,
    --prefix) it failed: "executor_main ... takes no resources, instance or force"."""
    import os
    import subprocess
    import sys

    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    script = tmp_path / "exp.py"
    script.write_text(
        "import sys\n"
        "from assets import Experiment, dataset\n"
        "from resources.zephyr import ZephyrResource\n"
        f"raw = dataset('raw/res-notes', {str(src)!r})\n"
        "experiment = Experiment('res', leaves=[raw])\n"
        "if __name__ == '__main__':\n"
        "    zephyr = ZephyrResource(backend='inline', max_workers=1)\n"
        "    experiment.materialize(resources={'zephyr': zephyr}, force=True)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "PYTHONPATH": repo}
    (tmp_path / "home").mkdir()

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), *flags], env=env, capture_output=True, text=True
        )

    prefix = str(tmp_path / "data")
    built = run("--prefix", prefix)
    assert built.returncode == 0, built.stderr
    (status,) = (tmp_path / "data" / "raw").glob("res-notes-*/.status.json")
    assert json.loads(status.read_text())["metadata"]["zephyr/backend"] == "inline"
    dry = run("--prefix", prefix, "--dry_run")
    assert dry.returncode == 0, dry.stderr
    assert "run    raw/res-notes-" in dry.stdout and "SUCCESS, forced" in dry.stdout, dry.stdout


KILLED_SCRIPT = """
import dataclasses, os, time
from marin_dagster.marin import ExecutorStep, executor_main, this_output_path, versioned

@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str
    n: int

def wait(cfg):
    open(os.environ["STARTED_FILE"], "w").close()
    while os.path.exists(os.environ["BLOCK_FILE"]):
        time.sleep(0.1)

step = ExecutorStep(name="t/wait", fn=wait, config=Cfg(this_output_path(), versioned(1)))
if __name__ == "__main__":
    executor_main(steps=[step])
"""


def _run_until_the_step_waits(tmp_path, dagster_home, **popen) -> tuple:
    """`python exp.py` of KILLED_SCRIPT, started and left inside its step: the process, the
    file that holds the step (remove it to let the step end), and the script's environment."""
    import subprocess
    import sys
    import time

    from tests.conftest import subprocess_env

    script = tmp_path / "exp.py"
    script.write_text(KILLED_SCRIPT)
    block, started = tmp_path / "block", tmp_path / "started"
    block.touch()
    env = subprocess_env(
        DAGSTER_HOME=dagster_home,
        MARIN_PREFIX=str(tmp_path / "data"),
        BLOCK_FILE=str(block),
        STARTED_FILE=str(started),
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=env, **popen)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the step never started"
        time.sleep(0.1)
    return proc, block, env


def test_a_killed_script_run_is_ended_by_the_next_run(tmp_path, dagster_home) -> None:
    """`python exp.py` killed with -9 left its run STARTED for ever: `marin status` judged only
    the runs of `dagster` commands, and two such runs held the daemon's two run slots, so a
    run launched from the UI stayed QUEUED. The script's run now names its process, and the
    next run (or `marin status`) ends it."""
    import os
    import signal
    import subprocess
    import sys

    from marin_dagster.execution.tags import RUN_PID_TAG

    proc, block, env = _run_until_the_step_waits(tmp_path, dagster_home)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    with dg.DagsterInstance.get() as instance:
        (killed,) = instance.get_runs()
        assert killed.status == dg.DagsterRunStatus.STARTED
        assert killed.tags[RUN_PID_TAG] == str(proc.pid)
    block.unlink()
    rerun = subprocess.run(
        [sys.executable, str(tmp_path / "exp.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"marked 1 run(s) whose process on this host is gone as failed: {killed.run_id}" in (
        rerun.stderr
    )
    with dg.DagsterInstance.get() as instance:
        assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
        statuses = {r.run_id: r.status for r in instance.get_runs()}
    assert sorted(s.value for s in statuses.values()) == ["FAILURE", "SUCCESS"]
    assert os.path.isdir(tmp_path / "data" / "t")


def test_ctrl_c_stops_a_script_run_and_says_how_to_resume(tmp_path, dagster_home) -> None:
    """A failed step no longer stops the run (the other branches run), but Ctrl-C still
    does, and says so: not "fix what failed"."""
    import signal
    import subprocess

    proc, _, _ = _run_until_the_step_waits(
        tmp_path, dagster_home, stderr=subprocess.PIPE, text=True
    )
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (-signal.SIGINT, 130), stderr[-2000:]
    assert "was stopped in t__wait" in stderr and "Run it again" in stderr, stderr[-2000:]
    assert "fix what failed" not in stderr


def test_an_unguarded_run_refuses_while_its_file_is_imported(tmp_path) -> None:
    """An experiment file calling materialize() with no `if __name__ == "__main__":` ran
    every step when `dagster asset list -f exp.py` only loaded it; run as a script, it runs."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    env = subprocess_env(MARIN_PREFIX=str(tmp_path / "data"), DAGSTER_HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for name, call in (
        ("exp", "Experiment('unguarded', leaves=[raw]).materialize()"),
        ("marin_style", "executor_main(steps=[raw])"),
    ):
        script = tmp_path / f"{name}.py"
        script.write_text(
            "from assets import Experiment, dataset\n"
            "from marin_dagster.marin import executor_main\n"
            f"raw = dataset('raw/unguarded-{name}', {str(src)!r})\n"
            f"{call}\n"
        )
        dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
        listed = subprocess.run(
            [dagster, "asset", "list", "-f", str(script)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert listed.returncode != 0
        assert f"{script}:4: " in listed.stderr, listed.stderr
        assert 'put the call under `if __name__ == "__main__":`' in listed.stderr
        assert not (tmp_path / "data").exists()  # nothing ran
        ran = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, cwd=tmp_path
        )
        assert ran.returncode == 0, ran.stderr
        assert list((tmp_path / "data" / "raw").glob(f"unguarded-{name}-*/.status.json"))
        shutil.rmtree(tmp_path / "data")


def test_a_users_resources_module_beside_the_file_is_named(tmp_path) -> None:
    """The project's own packages are `assets` and `resources`: a user's resources.py beside
    the experiment file hid the second, and the error named nothing of the user's."""
    import os
    import subprocess
    import sys

    (tmp_path / "resources.py").write_text('GPU_TYPE = "h100"\n')
    script = tmp_path / "exp.py"
    script.write_text("from assets import sample_corpus\ncorpus = sample_corpus('raw/x')\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "PYTHONPATH": repo}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 1
    assert (
        f"ImportError: {tmp_path / 'resources.py'} hides marin-dagster's `resources` package"
        in proc.stderr
    ), proc.stderr
