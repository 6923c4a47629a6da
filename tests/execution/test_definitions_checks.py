"""Mistakes in an experiment file refused when it is loaded, before any step runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from assets import Experiment, deduplicated, sample_corpus, tokenizer
from marin_dagster.execution.asset import DuplicateAssetError, upstream_closure
from tests.conftest import REPO, subprocess_env

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")


@pytest.mark.parametrize(
    "name",
    [
        "../escape",
        "raw/../../etc",
        "/abs/path",
        "raw//x",
        "raw/./x",
        "raw/",
        "",
        "raw/a b",
        "gs://bucket/x",
        "..",
    ],
)
def test_a_name_that_could_leave_the_prefix_is_refused(name):
    with pytest.raises(ValueError, match="is not allowed") as err:
        sample_corpus(name)
    assert repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["raw/shakespeare", "tokenizers/shakespeare-bpe", "a.b/c_d-1"])
def test_ordinary_names_are_accepted(name):
    *folders, last = name.split("/")
    # The last part carries the kind's label, so the graph tells raw from tokens.
    assert sample_corpus(name).key.path == [*folders, f"{last}_raw"]


def test_one_name_two_configs_in_one_experiment_names_both_lines():
    a = sample_corpus("raw/twice", num_shards=2)
    b = sample_corpus("raw/twice", num_shards=3)
    da = deduplicated("dedup/a", source=a, mode="exact")
    db = deduplicated("dedup/b", source=b, mode="exact")
    with pytest.raises(DuplicateAssetError) as err:
        Experiment("x", leaves=[da, db]).assets()
    message = str(err.value)
    assert "'raw/twice' is defined twice" in message
    # both definitions named by this file and line
    assert message.count(f"{__file__}:") == 2


def test_a_step_named_as_its_own_input_is_refused():
    """A tokenizer named `notes` on a dataset named `notes`: the closure kept the later one
    by name, the dataset vanished from the experiment, and the run failed asking for it."""
    corpus = sample_corpus("notes")
    tok = tokenizer("notes", source=corpus, vocab_size=300)
    with pytest.raises(DuplicateAssetError) as err:
        upstream_closure([tok])
    message = str(err.value)
    assert "'notes' is defined twice" in message, message


def test_the_same_definition_reached_twice_is_one_asset():
    corpus = sample_corpus("raw/once")
    leaves = [
        deduplicated("dedup/e", source=corpus, mode="exact"),
        deduplicated("dedup/f", source=corpus, mode="fuzzy"),
    ]
    assert [s.name for s in upstream_closure(leaves)].count("raw/once") == 1


LOCATION = textwrap.dedent("""
    from assets import Experiment, sample_corpus
    from assets.location import build_definitions

    first = Experiment("first", leaves=[sample_corpus("raw/shared", num_shards=2)])
    second = Experiment("second", leaves=[sample_corpus("raw/shared", num_shards=4)])
    defs = build_definitions([first, second])
""")


def _dagster(tmp_path, cwd, *args: str) -> subprocess.CompletedProcess:
    """The `dagster` CLI as a user runs it, with a Dagster home of its own under `tmp_path`."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [DAGSTER, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(DAGSTER_HOME=str(home)),
        stdin=subprocess.DEVNULL,
    )


def test_definitions_validate_refuses_two_experiments_sharing_a_name(tmp_path):
    """The user's check: `dagster definitions validate` fails and names both definitions."""
    location = tmp_path / "two_experiments.py"
    location.write_text(LOCATION)
    proc = _dagster(tmp_path, REPO, "definitions", "validate", "-f", str(location))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "'raw/shared' is defined twice" in out
    assert f"{location}:5" in out and f"{location}:6" in out
    assert "experiments 'first' and 'second'" in out


def test_a_file_that_star_imports_another_experiment_file_is_its_own_location(tmp_path):
    """`from parent_exp import *` copied parent_exp's loader into the child file, and Dagster
    loaded the child as the parent: the child's experiment was no job of `dagster job list`."""
    (tmp_path / "parent_exp.py").write_text(
        textwrap.dedent("""
        from assets import Experiment, sample_corpus
        corpus = sample_corpus("raw/star-parent")
        parent = Experiment("parent_exp", leaves=[corpus])
        """)
    )
    (tmp_path / "child_exp.py").write_text(
        textwrap.dedent("""
        from parent_exp import *
        from assets import Experiment, deduplicated
        clean = deduplicated("dedup/star-child", source=corpus, mode="exact")
        child = Experiment("child_exp", leaves=[clean])
        """)
    )
    proc = _dagster(tmp_path, tmp_path, "job", "list", "-f", str(tmp_path / "child_exp.py"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    jobs = sorted(line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("Job:"))
    assert jobs == ["__ASSET_JOB", "child_exp_job", "parent_exp_job"], out
