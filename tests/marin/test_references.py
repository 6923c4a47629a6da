"""Marin's references as Marin resolves them: hardcoded paths under the prefix, `/` for
sub-paths, nonblocking dependencies; and one name for one step, whatever its kind."""

from __future__ import annotations

import json
import os
import sys

import pytest

from assets import dataset
from assets.experiment import Experiment
from assets.location import build_definitions, module_definitions
from marin_dagster import fs
from marin_dagster.execution.asset import DuplicateAssetError, step_for
from marin_dagster.marin import (
    ExecutorStep,
    InputName,
    StepRunner,
    executor_main,
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


def _notes(tmp_path) -> str:
    path = tmp_path / "notes.jsonl"
    path.write_text('{"text": "a note"}\n')
    return str(path)


def _line(offset: int) -> str:
    """`file:line` of this test file, `offset` lines above the caller's."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno - offset}"


def test_a_step_named_like_a_factory_s_asset_is_refused_naming_both_definitions(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    raw = dataset("raw/notes", _notes(tmp_path))
    raw_at = _line(1)
    clash = ExecutorStep("raw/notes", record_config, {"out": this_output_path(), "v": versioned(1)})
    clash_at = _line(1)
    assert lower(raw).key != lower(clash).key  # the kind's suffix: raw/notes_raw
    message = (
        "asset 'raw/notes' is defined twice with different kinds of step: at "
        f"{raw_at} (dataset, version {step_for(raw).version}) and at {clash_at} "
        f"(executor_step, version {step_for(lower(clash)).version})"
    )
    with pytest.raises(SystemExit) as exit_:  # the script's one-line error, as a flag's
        executor_main(steps=[raw, clash], argv=["--prefix", str(tmp_path / "data")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "data" / "raw")  # refused before anything ran
    # downstream of one, beside the other: found as well
    user = _step("t/user", notes=output_path_of(raw))
    with pytest.raises(DuplicateAssetError, match="raw/notes"):
        StepRunner(prefix=str(tmp_path / "data")).plan([user, clash])
    # The file as a code location (`dagster dev -f`), and two experiments of one location.
    with pytest.raises(DuplicateAssetError) as err:
        module_definitions({"__file__": "notes_exp.py", "raw": raw, "clash": clash})
    assert message in str(err.value)
    with pytest.raises(DuplicateAssetError, match="experiments 'one' and 'two'"):
        build_definitions(
            [Experiment("one", leaves=[raw]), Experiment("two", leaves=[lower(clash)])]
        )


def test_two_executor_steps_of_one_name_are_refused_where_each_was_built(tmp_path):
    first = ExecutorStep("t/same", record_config, {"out": this_output_path(), "v": versioned(1)})
    first_at = _line(1)
    second = ExecutorStep("t/same", record_config, {"out": this_output_path(), "v": versioned(2)})
    second_at = _line(1)
    with pytest.raises(DuplicateAssetError) as err:
        StepRunner(prefix=str(tmp_path / "data")).plan([first, second])
    assert f"with different configs: at {first_at} (version " in str(err.value)
    assert f"and at {second_at} (version " in str(err.value)
    # the same step listed twice, or an equal one, is one step
    again = _step("t/same", v=versioned(1))
    assert [s.name for s in StepRunner(prefix=str(tmp_path)).plan([first, first, again])] == [
        "t/same"
    ]


def test_two_steps_of_one_name_read_by_one_config_are_refused(tmp_path):
    """References go by name: a step reading both took the second's output for the first,
    and ran, without a word."""
    first = _step("t/twin", v=versioned(1))
    second = _step("t/twin", v=versioned(2))
    top = _step("t/reader", inputs=[output_path_of(first), output_path_of(second)])
    with pytest.raises(DuplicateAssetError, match="asset 't/twin' is defined twice"):
        lower(top)


def test_steps_that_read_each_other_are_refused_naming_the_loop():
    """A recursion error of 2,500 lines, naming no step, before."""
    a = _step("t/loop-a", inp=None)
    b = _step("t/loop-b", inp=output_path_of(a))
    a.config["inp"] = output_path_of(b)
    with pytest.raises(ValueError) as err:
        lower(b)
    assert str(err.value).startswith(
        f"ExecutorSteps that need each other: t/loop-b (at {b.defined_at}) -> t/loop-a (at "
        f"{a.defined_at}) -> t/loop-b (at {b.defined_at})"
    ), str(err.value)
    alone = _step("t/self", inp=None)
    alone.config["inp"] = output_path_of(alone)
    with pytest.raises(ValueError, match="need each other: t/self .* -> t/self "):
        lower(alone)


def test_a_config_the_executor_cannot_see_into_is_refused():
    """Its versioned values stayed out of the version and its output path reached fn as a
    placeholder ('OutputName' object has no attribute 'rstrip')."""

    class Plain:
        def __init__(self, out, n):
            self.out, self.n = out, n

    with pytest.raises(TypeError) as err:
        ExecutorStep("t/plain", record_config, Plain(this_output_path(), versioned(3)))
    assert (
        str(err.value).startswith(f"ExecutorStep('t/plain') at {__file__}:")
        and "config must be a dataclass (as in Marin), a pydantic model or a dict, not a Plain"
        in str(err.value)
    )
