"""An experiment: a named set of leaf assets, its job, and in-process materialization."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from marin_dagster.execution.asset import upstream_closure
from marin_dagster.execution.instance import (
    fail_orphaned_runs,
    persistent_instance,
    run_process_tags,
)
from marin_dagster.execution.script import refuse_import_time_run
from marin_dagster.execution.tags import FORCE_TAG

_NAME = re.compile(r"[A-Za-z0-9_]+")
_NAME_FIX = re.compile(r"[^A-Za-z0-9_]+")

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Experiment:
    """Marin's experiment file: list the leaves; everything upstream comes along."""

    name: str
    leaves: Sequence[dg.AssetsDefinition]
    description: str = ""

    def __post_init__(self) -> None:
        # Checked here: Dagster refuses such a name only when a location loads, so
        # `python exp.py` ran while every `dagster ... -f exp.py` failed.
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Experiment({self.name!r}): the name becomes the Dagster asset group and the "
                f"job `{self.name}_job`, so it holds letters, digits and '_' only "
                f"(e.g. {_NAME_FIX.sub('_', str(self.name)).strip('_') or 'my_experiment'!r})"
            )
        if isinstance(self.leaves, dg.AssetsDefinition) or not isinstance(self.leaves, Sequence):
            raise TypeError(
                f"Experiment({self.name!r}): leaves must list the steps to build, e.g. "
                f"`leaves=[tokens]`; got {type(self.leaves).__name__}"
            )
        if not self.leaves:
            raise ValueError(
                f"Experiment({self.name!r}): leaves is empty, so its job would build nothing; "
                "list the last steps to build (everything they need comes along)"
            )
        try:
            upstream_closure(self.leaves)
        except (TypeError, ValueError) as e:
            if type(e) not in (TypeError, ValueError):
                raise  # its own kind (DuplicateAssetError), already naming both definitions
            raise type(e)(f"Experiment({self.name!r}): {e}") from None

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
        runs the data steps on Ray and keeps the local storage, Levanter and the rest).
        Called by the script Python runs, it takes `executor_main`'s flags (`python exp.py
        --dry_run`, `--prefix`, `--run_only`, `--force_run_failed`); they used to be ignored,
        and a dry run built everything."""
        refuse_import_time_run(f"Experiment({self.name!r}).materialize()")
        flags = _script_flags()
        if flags:
            from marin_dagster.marin import executor_main

            return executor_main(
                steps=self.leaves,
                description=self.description,
                argv=flags,
                resources=resources,
                instance=instance,
                force=force,
            )
        from resources import local_resources

        _warn_unplaced(self.leaves)
        instance = instance or persistent_instance()
        # A run of this process killed outright (kill -9, a closed terminal) never records its
        # end: it stayed STARTED, holding one of the daemon's run slots, until none was left
        # for a run launched from the UI. Its tags let this and `marin status` end it.
        ended = fail_orphaned_runs(instance)
        if ended:
            logger.warning(
                "marked %d run(s) whose process on this host is gone as failed: %s",
                len(ended),
                ", ".join(ended),
            )
        result = dg.materialize(
            self.assets(),
            instance=instance,
            # Merged, not replacing: a partial dict otherwise failed with Dagster's "resource
            # 'storage' required by op ... was not provided".
            resources={**local_resources(), **(resources or {})},
            tags={**run_process_tags(), **({FORCE_TAG: "true"} if force else {})},
            # Raising at the first failure stopped the run there: the steps that do not
            # depend on the failed one never started, as they do under `dagster job execute`.
            raise_on_error=False,
        )
        if not result.success:
            built = [s.asset.op.name for s in upstream_closure(self.leaves) if not s.observed]
            failed = StepsFailedError(result, built)
            if failed.interrupted:  # Ctrl-C: Dagster stopped the run; say so as Python does
                raise KeyboardInterrupt(str(failed)) from None
            raise failed
        return result


def _warn_unplaced(leaves: Sequence[dg.AssetsDefinition]) -> None:
    """A run in this process places no step: an accelerator or multi-host request is the Iris
    executor's to honour, and the script ran such steps without a word."""
    from marin_dagster.iris import ResourceConfig

    asks = []
    for step in upstream_closure(leaves):
        request = ResourceConfig.from_op_tags(step.asset.op.tags)
        if request.needs_accelerator or request.replicas > 1:
            asks.append(f"{step.name} ({request.to_string()})")
    if asks:
        logger.warning(
            "a run from a script runs every step in this process, on the devices it sees: "
            f"{', '.join(asks)} asked for more, which only the Iris executor places "
            "(dagster job execute -f <file> -j <job>)"
        )


class StepsFailedError(Exception):
    """Steps of an in-process run failed; the others ran, and those after a failed one were
    skipped. The message names each failed step, the first line of its error and its notes."""

    def __init__(self, result: dg.ExecuteInProcessResult, steps: Sequence[str]) -> None:
        self.result = result
        failures = {
            e.step_key: _root_cause(e.step_failure_data.error)
            for e in result.all_events
            if e.is_step_failure and e.step_failure_data and e.step_failure_data.error
        }
        ran = {e.step_key for e in result.all_events if e.is_step_success or e.is_step_failure}
        skipped = [key for key in steps if key not in ran]
        lines = []
        for key, error in failures.items():
            # The first line, and the notes after it (which original a copied file is of):
            # the note is what says where the fix goes.
            first, *rest = (error.message.strip() or error.cls_name).splitlines()
            lines.append(f"  {key}: {first}")
            lines += [f"    {line.strip()}" for line in rest if line.strip()][:3]
        after = f"; skipped after them: {', '.join(skipped)}" if skipped else ""
        self.interrupted = any(e.cls_name in _INTERRUPTS for e in failures.values())
        # No step failed: the run did before any step (a resource could not start, such as
        # storage at a prefix that cannot be written), and its error is the run's.
        run_error = None if failures else _run_error(result)
        if run_error is not None:
            first, *rest = (run_error.message.strip() or run_error.cls_name).splitlines()
            message = (
                f"run {result.run_id} failed before its steps ran (none did): {first}"
                + "".join(f"\n  {line.strip()}" for line in rest if line.strip())
            )
        elif self.interrupted:
            message = (
                f"run {result.run_id} was stopped in {', '.join(failures)}; not run: "
                f"{', '.join(skipped) or 'none'}. Run it again: what finished is skipped, and "
                "what was stopped resumes"
            )
        else:
            others = len(set(steps) - set(failures) - set(skipped))
            ran = f"; the other {others} step(s) ran" if others else ""
            message = (
                f"run {result.run_id}: {len(failures) or 'its'} step(s) failed{after}{ran}. "
                "The run's log (dagster dev shows it) has each step's; fix what failed and run "
                "again: what succeeded is skipped.\n" + "\n".join(lines)
            )
        super().__init__(message)


# What a step's error is when the run was stopped (Ctrl-C, SIGTERM), not failed.
_INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")


def _run_error(result: dg.ExecuteInProcessResult) -> Any:
    """The first error of the run's own events (a resource's, the run's), out of Dagster's
    wrapping: the resource's own error says what to do, the OSError under it does not."""
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        if error is not None:
            while error.cause is not None and (error.cls_name or "").startswith("Dagster"):
                error = error.cause
            return error
    return None


def _root_cause(error: Any) -> Any:
    """The user's own error inside Dagster's wrapping of it (SerializableErrorInfo)."""
    while error.cause is not None:
        error = error.cause
    return error


def _script_flags() -> list[str]:
    """The command line's flags when `materialize`'s caller is the script Python runs
    (`python exp.py --dry_run`); none when it is imported, a notebook's or a test's."""
    caller = sys._getframe(2).f_globals
    file = caller.get("__file__")
    if len(sys.argv) < 2 or caller.get("__name__") != "__main__" or not file:
        return []
    return sys.argv[1:] if os.path.abspath(file) == os.path.abspath(sys.argv[0]) else []
