"""The persistent Dagster instance (sqlite under DAGSTER_HOME, default ./.dagster).

Without a persistent instance Dagster keeps no history, so the UI and CLI
would lose every run; DESIGN section 8.
"""

from __future__ import annotations

import os

import dagster as dg

DEFAULT_HOME = ".dagster"

DAGSTER_YAML = """\
# Written by `marin init`. Local sqlite storage under this folder.
telemetry:
  enabled: false
run_queue:
  max_concurrent_runs: 2
"""

NUX_YAML = "seen: 1\n"


def ensure_home(home: str | None = None) -> str:
    """Create DAGSTER_HOME with its dagster.yaml if missing; returns the absolute path."""
    home = os.path.abspath(home or os.environ.get("DAGSTER_HOME") or DEFAULT_HOME)
    os.makedirs(os.path.join(home, ".nux"), exist_ok=True)
    config = os.path.join(home, "dagster.yaml")
    if not os.path.exists(config):
        with open(config, "w") as f:
            f.write(DAGSTER_YAML)
    nux = os.path.join(home, ".nux", "nux.yaml")
    if not os.path.exists(nux):
        with open(nux, "w") as f:
            f.write(NUX_YAML)
    return home


def persistent_instance() -> dg.DagsterInstance:
    os.environ["DAGSTER_HOME"] = ensure_home()
    return dg.DagsterInstance.get()
