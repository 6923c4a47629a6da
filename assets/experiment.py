"""An experiment: a named set of leaf assets, its job, and in-process materialization."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from marin_dagster.execution.asset import FORCE_TAG, upstream_closure
from marin_dagster.execution.instance import persistent_instance


@dataclasses.dataclass
class Experiment:
    """Marin's experiment file: list the leaves; everything upstream comes along."""

    name: str
    leaves: Sequence[dg.AssetsDefinition]
    description: str = ""

    @property
    def job_name(self) -> str:
        return f"{self.name}_job"

    def asset_keys(self) -> list[dg.AssetKey]:
        return [step.asset.key for step in upstream_closure(self.leaves)]

    def assets(self) -> list[dg.AssetsDefinition]:
        return [step.asset for step in upstream_closure(self.leaves)]

    def job(self) -> dg.UnresolvedAssetJobDefinition:
        return dg.define_asset_job(
            self.job_name,
            selection=dg.AssetSelection.assets(*self.asset_keys()),
            description=self.description or f"Materialize the {self.name} experiment end to end.",
        )

    def materialize(
        self,
        *,
        force: bool = False,
        resources: Mapping[str, Any] | None = None,
        instance: dg.DagsterInstance | None = None,
    ) -> dg.ExecuteInProcessResult:
        """Like Marin's `executor_main`: run in this process against the persistent instance.

        `resources` override the local ones by key (`{"zephyr": ZephyrResource(backend="ray")}`
        runs the data steps on Ray and keeps the local storage, Levanter and the rest)."""
        from resources import local_resources

        return dg.materialize(
            self.assets(),
            instance=instance or persistent_instance(),
            # Merged, not replacing: a partial dict otherwise failed with Dagster's "resource
            # 'storage' required by op ... was not provided".
            resources={**local_resources(), **(resources or {})},
            tags={FORCE_TAG: "true"} if force else None,
        )
