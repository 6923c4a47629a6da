"""LevanterResource: how training runs (dtype, devices, checkpoints, metrics), not what is trained.

Its fields are derived from the engine's `TrainerSettings` (same names, defaults and
descriptions), which it builds for `marin_dagster.levanter.train`, with a metrics callback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dagster as dg

from marin_dagster.levanter import TrainerSettings
from resources.derive import config_class, settings_dict

_LevanterFields = config_class("_LevanterFields", TrainerSettings, dg.ConfigurableResource, {})


class LevanterResource(_LevanterFields):
    """Compute dtype, mesh, remat, checkpoint policy and metrics logging for train_lm / evaluate."""

    def settings(self) -> TrainerSettings:
        return TrainerSettings(**settings_dict(self, TrainerSettings))

    def metrics_logger(self, logger: logging.Logger | Any) -> Callable[[dict[str, Any]], None]:
        """An `on_metrics` callback writing each metrics row to `logger` (e.g. context.log)."""
        return lambda row: logger.info(format_metrics(row))


def format_metrics(row: dict[str, Any]) -> str:
    parts = [f"step {row['step']}"]
    for key, fmt in (
        ("loss", ".4f"),
        ("learning_rate", ".3g"),
        ("grad_norm", ".3f"),
        ("tokens_per_second", ".0f"),
    ):
        if key in row:
            parts.append(f"{key} {row[key]:{fmt}}")
    if "mfu" in row:
        parts.append(f"mfu {row['mfu']:.2%}")
    parts += [f"{k} {v:.4f}" for k, v in row.items() if k.startswith("eval/")]
    return " ".join(parts)
