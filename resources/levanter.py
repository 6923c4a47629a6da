"""LevanterResource: how training runs (precision, devices, checkpoints, metrics), not what is trained.

It only builds the engine's `TrainerSettings` and a metrics callback; the
training itself is `marin_dagster.levanter.train`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from marin_dagster.levanter import TrainerSettings


class LevanterResource(dg.ConfigurableResource):
    """Precision, mesh, checkpoint policy and metrics logging for train_lm / evaluate assets."""

    precision: Literal["float32", "bfloat16"] = Field(
        default="float32", description="compute dtype of matmuls; parameters stay float32")
    num_devices: int | None = Field(default=None, description="devices in the mesh; None: all local devices")
    mesh: Literal["data_parallel", "fsdp"] = Field(
        default="data_parallel", description="replicated parameters, or parameters sharded over the devices")
    remat: Literal["none", "block", "dots"] = Field(
        default="dots", description="activation memory: dots (keep only matmul outputs; the fastest "
                                    "measured), none (keep all), block (recompute each decoder block)")
    checkpoint_every_steps: int | None = Field(
        default=None, description="save every N steps; None: every tenth of the run (at most a tenth "
                                  "of the work is lost when a run is killed)")
    checkpoint_every_minutes: float | None = Field(default=10.0, description="save every N minutes")
    keep: int | None = Field(default=2, description="checkpoints kept (None: all)")
    log_every: int = Field(default=10, description="log loss, lr, grad norm, tokens/s, MFU every N steps")
    peak_flops_per_device: float | None = Field(
        default=None, description="peak FLOP/s per device for MFU; None: known accelerators or a CPU estimate")
    sample_tokens: int = Field(default=64, description="tokens generated for the sample after training")
    sample_temperature: float = Field(default=0.8, description="0 for greedy sampling")

    def settings(self) -> TrainerSettings:
        return TrainerSettings(
            compute_dtype=self.precision,
            num_devices=self.num_devices,
            parallelism=self.mesh,
            remat=self.remat,
            checkpoint_every_steps=self.checkpoint_every_steps,
            checkpoint_every_minutes=self.checkpoint_every_minutes,
            keep=self.keep,
            log_every=self.log_every,
            peak_flops_per_device=self.peak_flops_per_device,
            sample_tokens=self.sample_tokens,
            sample_temperature=self.sample_temperature,
        )

    def metrics_logger(self, logger: logging.Logger | Any) -> Callable[[dict[str, Any]], None]:
        """An `on_metrics` callback writing each metrics row to `logger` (e.g. context.log)."""
        return lambda row: logger.info(format_metrics(row))


def format_metrics(row: dict[str, Any]) -> str:
    parts = [f"step {row['step']}"]
    for key, fmt in (("loss", ".4f"), ("learning_rate", ".3g"), ("grad_norm", ".3f"),
                     ("tokens_per_second", ".0f")):
        if key in row:
            parts.append(f"{key} {row[key]:{fmt}}")
    if "mfu" in row:
        parts.append(f"mfu {row['mfu']:.2%}")
    parts += [f"{k} {v:.4f}" for k, v in row.items() if k.startswith("eval/")]
    return " ".join(parts)
