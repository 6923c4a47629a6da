"""`marin init` on a path it cannot use: one clear line and a non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

MARIN = os.path.join(os.path.dirname(sys.executable), "marin")


def marin(*args: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MARIN, *args],
        env=subprocess_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_init_creates_the_home(tmp_path):
    out = marin("init", str(tmp_path / "home"), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"DAGSTER_HOME={tmp_path / 'home'}\n"
    assert os.path.isfile(tmp_path / "home" / "dagster.yaml")


@pytest.mark.parametrize("where", ["/proc/x", "a-file", "a-file/home"])
def test_init_on_a_path_it_cannot_use_says_so_in_one_line(tmp_path, where):
    (tmp_path / "a-file").write_text("not a folder\n")
    path = where if where.startswith("/") else str(tmp_path / where)
    out = marin("init", path, cwd=str(tmp_path))
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"marin init: cannot create the Dagster home {path}: "), lines
    assert "give a folder you can write" in lines[0]


def test_sql_serve_refuses_limit_and_names_the_flag_to_use(tmp_path):
    out = marin("sql", "--serve", "--limit", "5", "--prefix", str(tmp_path), cwd=str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--max-rows" in out.stderr and '"limit"' in out.stderr, out.stderr
    out = marin("sql", "SELECT 1", "--limit", "-3", "--prefix", str(tmp_path), cwd=str(tmp_path))
    assert out.returncode == 2 and "--limit: -3 is below 0" in out.stderr, out.stderr
