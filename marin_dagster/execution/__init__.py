"""Versioned steps: Marin's executor semantics (skip_existing, status, leases) for Dagster assets.

`version`, `status` and `lease` hold no Dagster code and are usable from any
process; `step` runs one versioned step; `asset` turns a step into a Dagster
asset.
"""

from marin_dagster.execution.lease import Lease, LeaseHeldError, LeaseSettings
from marin_dagster.execution.status import StepStatus, read_status
from marin_dagster.execution.step import StepOutcome, execute_step
from marin_dagster.execution.version import StepConfig, compute_version, unversioned

__all__ = [
    "Lease",
    "LeaseHeldError",
    "LeaseSettings",
    "StepConfig",
    "StepOutcome",
    "StepStatus",
    "compute_version",
    "execute_step",
    "read_status",
    "unversioned",
]
