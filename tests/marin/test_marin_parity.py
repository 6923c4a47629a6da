"""Marin features a porter reaches for: honoured as Marin does, or refused saying so (they
failed with Python's TypeError or AttributeError, or passed the dry run and failed the run)."""

from __future__ import annotations

import dataclasses
import os

import dagster as dg
import pytest

from marin_dagster.execution.status import StepStatus, read_status
from marin_dagster.marin import (
    ExecutorMainConfig,
    ExecutorStep,
    executor_main,
    lower,
    output_path_of,
    this_output_path,
    versioned,
)
from marin_dagster.marin.lower import check_dependency_groups


@dataclasses.dataclass(frozen=True)
class Cfg:
    output: str
    n: int


def write_n(config: Cfg) -> None:
    with open(os.path.join(config.output, "n.txt"), "w") as f:
        f.write(str(config.n))


def _output(tmp_path, step: ExecutorStep) -> str:
    from marin_dagster.execution.asset import step_for

    return str(tmp_path / "data" / f"{step.name}-{step_for(lower(step)).version}")


def test_executor_main_config_sets_what_the_flags_would(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    step = ExecutorStep("parity/config", write_n, Cfg(this_output_path(), versioned(1)))
    config = ExecutorMainConfig(prefix=str(tmp_path / "data"), dry_run=True)
    assert executor_main(config, steps=[step], argv=[]) is None  # a dry run: nothing built
    assert capsys.readouterr().out.startswith("run    parity/config-")
    assert not (tmp_path / "data").exists()
    executor_main(config, steps=[step], argv=["--dry_run", "false"])  # a flag overrides it
    assert read_status(_output(tmp_path, step)).status == StepStatus.SUCCESS
    with pytest.raises(ValueError, match="executor_info_base_path is not supported"):
        ExecutorMainConfig(executor_info_base_path="gs://b/info")


def test_a_steps_output_reference_given_as_a_step_runs_that_step(tmp_path, monkeypatch):
    """Marin takes `output_path_of(step, ...)` in `steps=`; it was "cannot run InputName"."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    step = ExecutorStep("parity/ref", write_n, Cfg(this_output_path(), versioned(2)))
    executor_main(steps=[output_path_of(step, "n.txt")], argv=["--prefix", str(tmp_path / "data")])
    with open(os.path.join(_output(tmp_path, step), "n.txt")) as f:
        assert f.read() == "2"


def test_override_output_path_and_misspelt_fields_are_refused_saying_why():
    with pytest.raises(TypeError, match=r"override_output_path is not supported; outputs are"):
        ExecutorStep("parity/x", write_n, Cfg(this_output_path(), 1), override_output_path="p/x")
    with pytest.raises(TypeError, match=r"unknown keyword 'descripton'; did you mean 'desc"):
        ExecutorStep("parity/x", write_n, Cfg(this_output_path(), 1), descripton="x")


def test_pip_dependency_groups_take_packages_as_marin_does():
    check_dependency_groups("parity/x", ["numpy>=1", "pyarrow"])  # installed: no complaint
    with pytest.raises(
        dg.Failure, match=r"'no-such-package-xyz>=1' is not installed here.*pip install"
    ):
        check_dependency_groups("parity/x", ["no-such-package-xyz>=1"])
    with pytest.raises(dg.Failure, match=r"'!!' is neither an extra of marin-dagster"):
        check_dependency_groups("parity/x", ["!!"])


def test_a_ray_remote_function_runs_as_a_ray_task(tmp_path, monkeypatch, ray_cluster):
    """Marin calls `fn.remote(config)` for a `@ray.remote` fn; called directly Ray refuses."""
    import ray

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    step = ExecutorStep("parity/ray", ray.remote(write_n), Cfg(this_output_path(), versioned(3)))
    executor_main(steps=[step], argv=["--prefix", str(tmp_path / "data")])
    out = _output(tmp_path, step)
    with open(os.path.join(out, "n.txt")) as f:
        assert f.read() == "3"
    assert read_status(out).metadata["fn"] == f"{__name__}.write_n"


def test_a_versioned_reference_is_the_reference():
    """`versioned(output_path_of(step))` failed: "cannot version a value of type function",
    naming the upstream step's fn. A reference's step version enters the version anyway."""
    from marin_dagster.execution.asset import step_for

    @dataclasses.dataclass(frozen=True)
    class Reads:
        output: str
        source: object

    up = ExecutorStep("parity/up", write_n, Cfg(this_output_path(), versioned(1)))
    wrapped = ExecutorStep(
        "parity/down", write_n, Reads(this_output_path(), versioned(output_path_of(up)))
    )
    plain = ExecutorStep("parity/down", write_n, Reads(this_output_path(), output_path_of(up)))
    assert step_for(lower(wrapped)).version == step_for(lower(plain)).version
