"""LevanterResource is derived from the engine's TrainerSettings: every setting, under the same
name, reaches the settings it builds; it formats metrics for a logger."""

from __future__ import annotations

import dataclasses
import logging

import dagster as dg
import pytest

from marin_dagster.levanter import TrainerSettings
from resources.levanter import LevanterResource, format_metrics


def test_settings_come_from_the_resource_fields() -> None:
    values = dict(
        parallelism="fsdp",
        remat="block",
        num_devices=2,
        checkpoint_every_steps=50,
        checkpoint_every_minutes=None,
        keep=3,
        log_every=5,
        peak_flops_per_device=1e12,
        sample_tokens=3,
        sample_temperature=0.0,
    )
    assert set(values) == {f.name for f in dataclasses.fields(TrainerSettings)}, (
        "a setting is untested"
    )
    assert LevanterResource(**values).settings() == TrainerSettings(**values)
    assert LevanterResource().settings() == TrainerSettings()


@dg.op
def uses(levanter: LevanterResource) -> str:
    return levanter.settings().remat


@dg.job(resource_defs={"levanter": LevanterResource.configure_at_launch()})
def remat_job() -> None:
    uses()


def _run(**config: object) -> dg.ExecuteInProcessResult:
    return remat_job.execute_in_process(run_config={"resources": {"levanter": {"config": config}}})


def test_a_bad_setting_is_refused_by_dagster_config() -> None:
    assert _run(remat="block").output_for_node("uses") == "block"
    with pytest.raises(dg.DagsterInvalidConfigError, match="remat"):
        _run(remat="everything")


def test_compute_dtype_is_not_a_run_setting() -> None:
    """It changes the trained model, so it is the step's config (in its version): a run that
    sets it on the resource is refused by name instead of training what the version says not."""
    with pytest.raises(dg.DagsterInvalidConfigError, match="compute_dtype"):
        _run(compute_dtype="bfloat16")


def test_metrics_logger_writes_rows(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.levanter.resource")
    on_metrics = LevanterResource().metrics_logger(logger)
    with caplog.at_level(logging.INFO, logger="tests.levanter.resource"):
        on_metrics(
            {
                "step": 10,
                "loss": 2.5,
                "learning_rate": 1e-3,
                "grad_norm": 0.5,
                "tokens_per_second": 1234.0,
                "mfu": 0.0123,
            }
        )
        on_metrics({"step": 10, "eval/val/loss": 2.25})
    assert caplog.messages == [
        "step 10 loss 2.5000 learning_rate 0.001 grad_norm 0.500 tokens_per_second 1234 mfu 1.23%",
        "step 10 eval/val/loss 2.2500",
    ]
    assert format_metrics({"step": 1}) == "step 1"
