"""Experiment.materialize: what a script run binds."""

from __future__ import annotations

import json

import dagster as dg

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
