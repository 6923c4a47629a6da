"""The linter and the formatter's check are part of the suite, so CI fails on a violation: the
layering (engines never import Dagster) is a ruff rule, not a habit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RUFF, *args], cwd=REPO, capture_output=True, text=True, timeout=300, input=stdin
    )


def test_ruff_check_passes():
    proc = _ruff("check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tree_is_formatted():
    proc = _ruff("format", "--check", ".")
    assert proc.returncode == 0, (
        "run `ruff format .` (make lint checks it):\n" + proc.stdout + proc.stderr
    )


@pytest.mark.parametrize(
    "engine",
    [
        "marin_dagster/zephyr/plan.py",
        "marin_dagster/levanter/model.py",
        "marin_dagster/dupekit/fuzzy.py",
        "marin_dagster/tokenize/cache.py",
        "marin_dagster/iris/settings.py",
        "marin_dagster/fs.py",
    ],
)
@pytest.mark.parametrize(
    "line",
    [
        "import dagster",
        "from dagster._core.events import DagsterEvent",
        "from dagster_k8s.job import get_k8s_job_name",
    ],
)
def test_an_engine_importing_dagster_is_a_lint_error(engine, line):
    proc = _ruff("check", "--stdin-filename", engine, "-", stdin=line + "\n")
    assert proc.returncode != 0 and "TID251" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "allowed",
    ["assets/raw.py", "resources/zephyr.py", "assets/sensors.py", "marin_dagster/iris/executor.py"],
)
def test_dagster_facing_modules_may_import_dagster(allowed):
    proc = _ruff(
        "check",
        "--select",
        "TID251",
        "--stdin-filename",
        allowed,
        "-",
        stdin="import dagster\n\nprint = dagster\n",
    )
    assert proc.returncode == 0, proc.stdout
