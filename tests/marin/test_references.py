"""Marin's references as Marin resolves them: hardcoded paths under the prefix, `/` for
sub-paths, nonblocking dependencies."""

from __future__ import annotations

import json
import os

from marin_dagster import fs
from marin_dagster.execution.asset import step_for
from marin_dagster.marin import (
    ExecutorStep,
    InputName,
    StepRunner,
    instantiate,
    lower,
    output_path_of,
    this_output_path,
    versioned,
)


def record_config(config: dict) -> None:
    """Writes the config it got, paths resolved, into its own output."""
    fs.write_json(fs.join(config["out"], "config.json"), config)


def _received(step: ExecutorStep, prefix: str) -> dict:
    s = step_for(lower(step))
    return json.load(open(os.path.join(prefix, f"{s.name}-{s.version}", "config.json")))


def _step(name: str, **config) -> ExecutorStep:
    return ExecutorStep(name, record_config, {"out": this_output_path(), **config})


def test_a_relative_hardcoded_path_is_under_the_prefix_and_versioned_as_written(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    step = _step(
        "t/hard",
        rel=InputName.hardcoded("relative/thing.txt"),
        abs=InputName.hardcoded("/fixed/thing.txt"),
        url=InputName.hardcoded("gs://bucket/thing.txt"),
        sub=InputName.hardcoded("relative") / "dir" / "thing.txt",
    )
    monkeypatch.chdir(tmp_path)  # a path left relative would resolve here, not under the prefix
    for prefix in (str(tmp_path / "one"), str(tmp_path / "two")):
        StepRunner(prefix=prefix).run([step])
        got = _received(step, prefix)
        assert got["rel"] == os.path.join(prefix, "relative/thing.txt")
        assert got["sub"] == os.path.join(prefix, "relative/dir/thing.txt")
        assert (got["abs"], got["url"]) == ("/fixed/thing.txt", "gs://bucket/thing.txt")
    # The version holds the path as written, so it is the same under either prefix.
    assert sorted(os.listdir(tmp_path / "one" / "t")) == sorted(os.listdir(tmp_path / "two" / "t"))


def test_slash_appends_a_sub_path_to_a_reference():
    a = _step("t/a", n=versioned(1))
    assert output_path_of(a) / "sub" / "f.txt" == output_path_of(a, "sub/f.txt")
    assert a / "sub" == InputName(a, "sub") == a.cd("sub")
    assert output_path_of(a, "sub") / "f.txt" == InputName(a, "sub/f.txt")
    assert InputName.hardcoded("raw") / "x" == InputName.hardcoded("raw/x")
    # nonblocking survives the `/` (Marin's cd drops it, which `ref.nonblocking() / "x"`
    # never means)
    assert (output_path_of(a).nonblocking() / "x").block_on_step is False
    got = instantiate({"in": a / "sub" / "f.txt"}, {"t/a": "/p/t/a-1"}, "/p/t/b-2", "/p")
    assert got == {"in": "/p/t/a-1/sub/f.txt"}


def test_a_nonblocking_dependency_enters_the_version_but_is_not_run_or_waited_for(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    prefix = str(tmp_path / "data")

    def reader(a: ExecutorStep, nonblocking: bool = True) -> ExecutorStep:
        ref = output_path_of(a) / "checkpoints"
        return _step("t/reader", ckpt=ref.nonblocking() if nonblocking else ref)

    train = _step("t/train", n=versioned(1))
    b = reader(train)
    assert lower(b).asset_deps[lower(b).key] == set()  # no edge: Dagster does not wait for it
    assert [s.name for s in StepRunner(prefix=prefix).plan([b])] == ["t/reader"]
    # Its version is in b's: another train is another reader.
    assert step_for(lower(reader(_step("t/train", n=versioned(2))))).version != (
        step_for(lower(b)).version
    )
    assert step_for(lower(reader(train, nonblocking=False))).version != step_for(lower(b)).version

    StepRunner(prefix=prefix).run([b])
    t = step_for(lower(train))
    train_dir = os.path.join(prefix, f"t/train-{t.version}")
    # b got where train writes, though train has not run
    assert _received(b, prefix)["ckpt"] == os.path.join(train_dir, "checkpoints")
    assert not os.path.exists(train_dir)
    s = step_for(lower(b))
    info = json.load(open(os.path.join(prefix, f"{s.name}-{s.version}", ".executor_info")))
    assert info["dependencies"] == {}
    assert info["pseudo_dependencies"] == {"t/train": train_dir}

    # A step that depends on train normally, listed beside b, still runs it first.
    c = _step("t/eval", ckpt=output_path_of(train))
    StepRunner(prefix=prefix).run([b, c])
    assert _received(c, prefix)["ckpt"] == train_dir
    assert json.load(open(os.path.join(train_dir, "config.json")))["n"] == 1
