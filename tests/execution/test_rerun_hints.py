"""What a failed step tells the user to run: the code location the run came from, and a
prefix that cannot work from the dagster CLI."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import dagster as dg
import pytest

from assets import dataset, tokenizer
from resources import local_resources
from tests.conftest import REPO, subprocess_env

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")

EXPERIMENT = """
from assets import dataset, tokenizer

raw = dataset("raw/notes", {source!r})
tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300)
"""


def _notes(tmp_path) -> str:
    src = tmp_path / "notes.jsonl"
    src.write_text("".join(f'{{"text": "note {i}: to be, or not to be"}}\n' for i in range(40)))
    return str(src)


def _dagster(args: list[str], prefix: str, home: str) -> subprocess.CompletedProcess:
    env = subprocess_env(
        MARIN_PREFIX=prefix, DAGSTER_HOME=home, PYTHONWARNINGS="ignore::FutureWarning"
    )
    return subprocess.run(
        [DAGSTER, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_missing_input_names_the_command_for_this_code_location(tmp_path, dagster_home):
    """Selected from an experiment file with its input never built: the hint is for that
    file, and running the hint as printed builds the input."""
    exp = tmp_path / "my exp.py"  # a space in the path: the hint quotes it
    exp.write_text(EXPERIMENT.format(source=_notes(tmp_path)))
    prefix = str(tmp_path / "data")
    failed = _dagster(
        ["asset", "materialize", "-f", str(exp), "--select", "tokenizers/notes_tokenizer"],
        prefix,
        dagster_home,
    )
    assert failed.returncode != 0
    out = failed.stdout + failed.stderr
    hint = (
        f"dagster asset materialize -f {shlex.quote(str(exp))} "
        "--select '+tokenizers/notes_tokenizer'"
    )
    assert hint in out, out[-3000:]
    assert "marin_dagster.definitions" not in out
    ran = _dagster(shlex.split(hint)[1:], prefix, dagster_home)  # builds both
    assert ran.returncode == 0 and "RUN_SUCCESS" in ran.stdout + ran.stderr
    assert ran.stdout.count("STEP_SUCCESS") + ran.stderr.count("STEP_SUCCESS") == 2


def test_a_missing_input_in_a_script_names_the_file_that_defined_the_step(tmp_path):
    raw = dataset("raw/notes", _notes(tmp_path))
    tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300)
    resources = local_resources(str(tmp_path / "data"))
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.Failure) as err:
            dg.materialize([raw, tok], selection=[tok], instance=instance, resources=resources)
    assert f"dagster asset materialize -f {shlex.quote(__file__)} --select" in str(err.value)


def test_a_memory_prefix_from_the_cli_is_refused_before_any_work(tmp_path, dagster_home):
    """memory:// outputs die with the step's process: from the CLI a step would report
    success for data no one can read."""
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT.format(source=_notes(tmp_path)))
    done = _dagster(
        ["asset", "materialize", "-f", str(exp), "--select", "raw/notes_raw"],
        "memory://notes/data",
        dagster_home,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "RUN_SUCCESS" not in out
    assert "keeps outputs in one process's memory" in out and "MARIN_PREFIX" in out
