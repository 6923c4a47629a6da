"""File-change sensors: a watched folder's content hash drives runs of the experiment below it.

`watched_folder_sensor` requests a run of the assets downstream of the folder
when the folder's content hash (`marin_dagster.datasets.watch`) differs from the
last requested one and has been quiet for `settle_s` (a burst of writes gives
one run). The sensor's
cursor keeps the content hash of its last run request, so a change made while
the code server was down is found on its first tick, and a content hash equal
to the last request gives none (a change undone). While a run it requested is
queued or running, a new change waits and is requested once that run ends.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import dagster as dg

from assets.experiment import Experiment
from assets.watched import WATCHED_KIND
from marin_dagster.datasets.watch import content_hash, folder_state
from marin_dagster.execution.asset import Step, step_for, upstream_closure
from marin_dagster.execution.tags import CONTENT_TAG, WATCH_TAG

logger = logging.getLogger(__name__)

_DATA_VERSION_TAG = "dagster/data_version"


@dataclasses.dataclass
class WatchCursor:
    requested: str | None = None
    """Content hash of the last run request."""
    pending: str | None = None
    pending_since: float = 0.0
    requests: int = 0

    @classmethod
    def parse(cls, raw: str | None) -> WatchCursor:
        if not raw:
            return cls()
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            logger.warning(f"watched-folder sensor: unreadable cursor {raw!r}; starting over")
            return cls()

    def dump(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _downstream_keys(steps: Sequence[Step], folder_key: dg.AssetKey) -> list[dg.AssetKey]:
    below: dict[dg.AssetKey, bool] = {}

    def is_below(step: Step) -> bool:
        key = step.asset.key
        if key not in below:
            below[key] = any(
                up.asset.key == folder_key or is_below(up) for up in step.upstream.values()
            )
        return below[key]

    return [s.asset.key for s in steps if s.asset.key != folder_key and is_below(s)]


def _patterns_read(steps: Sequence[Step], folder_key: dg.AssetKey) -> list[str]:
    """The `pattern`s of the corpora reading the folder: a change to a file none of them
    reads builds nothing, so it requests no run."""
    return sorted(
        {
            getattr(s.config, "pattern", "*")
            for s in steps
            if any(up.asset.key == folder_key for up in s.upstream.values())
        }
    )


def _active_runs(instance: dg.DagsterInstance, sensor_name: str) -> list[str]:
    statuses = [
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    ]
    runs = instance.get_runs(
        filters=dg.RunsFilter(tags={WATCH_TAG: sensor_name}, statuses=statuses)
    )
    return [r.run_id for r in runs]


def watched_folder_sensor(
    folder: dg.AssetsDefinition,
    experiment: Experiment,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 10,
    settle_s: float = 2.0,
    full_scan_s: float = 300.0,
    watch: bool = True,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """A sensor requesting a run of `experiment`'s assets below `folder` when its files change."""
    folder_step = step_for(folder)
    if folder_step.kind != WATCHED_KIND:
        raise ValueError(f"{folder_step.name} is a {folder_step.kind}, not a watched_folder")
    path = folder_step.config.path
    steps = upstream_closure(experiment.leaves)
    targets = _downstream_keys(steps, folder.key)
    if not targets:
        raise ValueError(
            f"experiment {experiment.name!r} has no asset downstream of {folder_step.name}"
        )
    sensor_name = name or f"{experiment.name}__{folder_step.name.replace('/', '__')}_sensor"
    patterns = _patterns_read(steps, folder.key)
    read_by_all = not patterns or "*" in patterns
    matching = "" if read_by_all else f" matching {' or '.join(map(repr, patterns))}"

    @dg.sensor(
        name=sensor_name,
        job_name=experiment.job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Runs {experiment.name}'s assets below {folder_step.name} when files under "
        f"{path} are added, changed or deleted; not when none is left: what was built from "
        "them stays as it is.",
    )
    def sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = WatchCursor.parse(context.cursor)
        snap = folder_state(path, watch=watch, full_scan_s=full_scan_s).snapshot()
        now = time.time()
        events: list[Any] = []
        read = {
            rel: digest
            for rel, digest in snap.digests.items()
            if read_by_all or any(fnmatch.fnmatch(rel, p) for p in patterns)
        }
        # The hash of the files the corpora read: the folder's own data version (below)
        # covers every file, so that it stays the one the folder's observation records.
        h = snap.content_hash if read_by_all else content_hash(read)
        context.log.info(
            f"{path}: {snap.files} files ({len(read)}{matching} read), hash {h}, "
            f"{snap.hashed} hashed, {snap.statted} statted "
            f"({'full scan' if snap.full_scan else 'watchdog'})"
        )
        if not read:
            # Nothing to build from; an empty inbox (new, or emptied) is not a change to run.
            cursor.pending = None
            return dg.SensorResult(
                skip_reason=f"no files under {path}{matching}: nothing to build; drop files "
                "there to start a run",
                cursor=cursor.dump(),
            )
        if h == cursor.requested:
            cursor.pending = None
            return dg.SensorResult(
                skip_reason=f"{path}{matching} unchanged since the last run request ({h})",
                cursor=cursor.dump(),
            )
        if h != cursor.pending:
            cursor.pending, cursor.pending_since = h, now
            events.append(
                dg.AssetObservation(
                    asset_key=folder.key,
                    tags={_DATA_VERSION_TAG: snap.content_hash},
                    metadata={
                        "files": snap.files,
                        "bytes": snap.bytes,
                        "path": dg.MetadataValue.path(path),
                    },
                )
            )
        quiet_for = now - max(cursor.pending_since, min(snap.last_change, now))
        if quiet_for < settle_s:
            return dg.SensorResult(
                skip_reason=f"{path} changed {quiet_for:.1f} s ago; waiting for {settle_s:g} s of quiet",
                cursor=cursor.dump(),
                asset_events=events,
            )
        active = _active_runs(context.instance, sensor_name)
        if active:
            return dg.SensorResult(
                skip_reason=f"run {active[0]} for an earlier change is not finished; "
                "this change is requested when it ends",
                cursor=cursor.dump(),
                asset_events=events,
            )
        cursor.requests += 1
        cursor.requested, cursor.pending = h, None
        request = dg.RunRequest(
            run_key=f"{sensor_name}:{cursor.requests}:{h}",
            asset_selection=targets,
            # Not forced: the corpus records the files it was built from and each step its
            # inputs' data versions, so the run rebuilds what the new files change and
            # skips a step whose input came out the same (a filter that drops the new files).
            tags={WATCH_TAG: sensor_name, CONTENT_TAG: h},
        )
        return dg.SensorResult(run_requests=[request], cursor=cursor.dump(), asset_events=events)

    return sensor


def sensors_for(experiments: Sequence[Experiment], **options: Any) -> list[dg.SensorDefinition]:
    """A sensor per watched folder of each experiment (experiments without one get none)."""
    out = []
    for experiment in experiments:
        for step in upstream_closure(experiment.leaves):
            if step.kind == WATCHED_KIND:
                out.append(watched_folder_sensor(step.asset, experiment, **options))
    return out
