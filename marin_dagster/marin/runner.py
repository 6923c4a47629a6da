"""Running steps from a script: `StepRunner().run([...])` and `executor_main(steps=[...])`.

Both materialize the steps and everything upstream in this process against the persistent
Dagster instance (DAGSTER_HOME, default ./.dagster), so the runs, their logs and the assets'
history show in `dagster dev` afterwards. A step whose output already holds SUCCESS for its
version is skipped, as in Marin.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from assets.experiment import Experiment
from marin_dagster import fs
from marin_dagster.execution.asset import DuplicateAssetError, Step, upstream_closure
from marin_dagster.execution.lease import holder_gone
from marin_dagster.execution.script import refuse_import_time_run
from marin_dagster.execution.status import StepStatus, read_status
from marin_dagster.marin.lower import lower
from marin_dagster.settings import parse_bool


def _experiment_name() -> str:
    """The running script's file name, as Dagster names allow (letters, digits, '_')."""
    main = sys.modules.get("__main__")
    stem = os.path.splitext(os.path.basename(getattr(main, "__file__", "") or "steps"))[0]
    return re.sub(r"\W", "_", stem) or "steps"


class PlanError(ValueError):
    """What was asked of the runner cannot be planned (a run_only that matches nothing, steps
    that failed before with force_run_failed off); the message says what to do."""


class StepRunner:
    """Marin's StepRunner: `run(steps)` materializes the steps and their dependencies."""

    def __init__(self, prefix: str | None = None, name: str | None = None) -> None:
        self.prefix = prefix
        self.name = name

    def plan(self, steps: Sequence[Any], run_only: Sequence[str] | None = None) -> list[Step]:
        """The steps to materialize, upstream first: `steps` (or those of them and of their
        dependencies whose names match a `run_only` regex) and all they depend on."""
        leaves = [lower(s) for s in steps]
        if run_only:
            try:
                patterns = [re.compile(p) for p in run_only]
            except re.error as e:
                raise PlanError(
                    f"run_only {e.pattern!r} is not a regular expression: {e}"
                ) from None
            matched = [
                s.asset for s in upstream_closure(leaves) if any(p.search(s.name) for p in patterns)
            ]
            if not matched:
                names = ", ".join(s.name for s in upstream_closure(leaves))
                raise PlanError(f"run_only {list(run_only)} matches no step; the steps: {names}")
            leaves = matched
        return upstream_closure(leaves)

    def run(
        self,
        steps: Sequence[Any],
        *,
        dry_run: bool = False,
        run_only: Sequence[str] | None = None,
        force_run_failed: bool = True,
        force: bool = False,
        max_concurrent: int | None = None,
        instance: dg.DagsterInstance | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> dg.ExecuteInProcessResult | None:
        """Materialize `steps` and their dependencies; with `dry_run`, print what would run.

        With `dry_run`, a step that would be skipped reads `skip`, one that would run `run`,
        and a FAILED one that `force_run_failed=False` refuses `refuse` (then nothing runs).
        Steps run one at a time in this process (`max_concurrent` is accepted for Marin's
        scripts); to run independent steps side by side, launch the file's job with
        `dagster job execute -f <file>` (the Iris executor runs them in parallel).
        `force_run_failed=False` refuses to rerun a step whose last attempt FAILED.
        `resources` override the local ones by key, as `Experiment.materialize`'s do.
        """
        from resources import local_resources
        from resources.storage import StorageError, prefix_problem

        if resources and "storage" in resources and self.prefix is not None:
            raise PlanError("--prefix and a storage resource both say where outputs go; drop one")
        # prefix None: MARIN_PREFIX, else ./data
        resources = {**local_resources(self.prefix), **(resources or {})}
        plan = self.plan(steps, run_only)
        storage = resources["storage"]
        try:
            problem = prefix_problem(storage.root)
        except StorageError as e:
            raise PlanError(str(e)) from None
        try:
            states = {s.name: read_status(storage.output_path(s.name, s.version)) for s in plan}
        except Exception as e:
            if not fs.unreachable(e):
                raise
            # gcsfs's retries end in 30 frames of aiohttp: say what to check instead
            raise PlanError(
                f"cannot reach the storage of {storage.root} ({type(e).__name__}: {e}); check "
                "that it is up and reachable (the network, credentials, STORAGE_EMULATOR_HOST "
                "for an emulator)"
            ) from None
        failed = [
            s.name for s in plan if states[s.name] and states[s.name].status == StepStatus.FAILED
        ]
        refusal = None
        if failed and not force_run_failed:
            refusal = (
                f"steps {failed} FAILED before; rerun with force_run_failed=True "
                "(--force_run_failed true) to try them again"
            )
        if dry_run:
            # The same decisions as the run below, so the plan shown is the run one gets.
            idle: set[str] = set()  # steps skipped for want of input, and those after them
            runs: set[str] = set()
            for s in plan:
                if s.observed:  # a watched folder: read where it is, never written
                    print(f"{'watch':6} {s.name} ({s.kind}) -> {s.config.path}")
                    continue
                record = states[s.name]
                state = record.status.value if record else "missing"
                if record and record.status == StepStatus.RUNNING:
                    path = storage.output_path(s.name, s.version)
                    # as `marin status` says it: a killed run's output, which the run resumes
                    state = "RUNNING, interrupted" if holder_gone(path) else state
                reason = s.why_nothing_to_build()
                after = next((up.name for up in s.upstream.values() if up.name in idle), None)
                if reason or after:
                    idle.add(s.name)
                    why = f"nothing to build: {reason}" if reason else f"after {after}, skipped"
                    action, state = "skip", f"{state}; {why}"
                elif record and record.status == StepStatus.SUCCESS:
                    # a SUCCESS built from inputs that changed since is rebuilt
                    changed = s.changed_inputs(record, storage.output_path)
                    # ... and so is one whose input the run rebuilds, when that output
                    # comes out other than it was (which only the run can tell)
                    rebuilt = next((up.name for up in s.upstream.values() if up.name in runs), None)
                    action = "run" if changed or rebuilt or force else "skip"
                    if force:
                        state = f"{state}, forced"
                    elif changed:
                        state = f"{state}, inputs changed"
                    elif rebuilt:
                        state = f"{state}; after {rebuilt}, if its new output differs"
                elif refusal and s.name in failed:
                    action = "refuse"
                else:
                    action = "run"
                if action == "run" and refusal:
                    # nothing runs when a FAILED step is refused; the line below says why
                    action, state = "skip", f"{state}; the run is refused"
                if action == "run":
                    runs.add(s.name)
                print(
                    f"{action:6} {s.name}-{s.version} ({s.kind}, {state}) -> "
                    f"{storage.output_path(s.name, s.version)}"
                )
            if refusal:
                print(f"nothing would run: {refusal}")
            elif problem is not None:
                print(f"a run would fail: {problem}; give --prefix (or MARIN_PREFIX) another")
            return None
        if refusal:
            raise PlanError(refusal)
        experiment = Experiment(self.name or _experiment_name(), leaves=[s.asset for s in plan])
        return experiment.materialize(force=force, resources=resources, instance=instance)


@dataclasses.dataclass(frozen=True)
class ExecutorMainConfig:
    """Marin's `executor_main` settings in code; the command line's flags override them."""

    prefix: str | None = None
    executor_info_base_path: str | None = None
    dry_run: bool = False
    force_run_failed: bool = True
    run_only: list[str] | None = None

    def __post_init__(self) -> None:
        if self.executor_info_base_path is not None:
            raise ValueError(
                "ExecutorMainConfig.executor_info_base_path is not supported: each step's "
                "record of what ran is its output's .executor_info (marin status shows the "
                "outputs); drop it"
            )


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def executor_main(
    config: Any = None,
    steps: Sequence[Any] = (),
    description: str | None = None,
    argv: Sequence[str] | None = None,
    *,
    resources: Mapping[str, Any] | None = None,
    instance: dg.DagsterInstance | None = None,
    force: bool = False,
) -> dg.ExecuteInProcessResult | None:
    """An experiment script's entry point, Marin's flags included:

    --prefix PATH          where outputs go (default MARIN_PREFIX or ./data)
    --dry_run true         print each step, its version, path and whether it would run
    --run_only REGEX ...   only the steps matching (and what they depend on)
    --force_run_failed B   rerun steps that FAILED (default true)

    `resources`, `instance` and `force` are `Experiment.materialize`'s, which a script run
    with these flags passes on.
    """
    refuse_import_time_run("executor_main()")
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--prefix", default=None, help="where outputs go (default: MARIN_PREFIX, else ./data)"
    )
    parser.add_argument(
        "--dry_run",
        "--dry-run",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="print each step, its version, its output and whether a run would build it",
    )
    parser.add_argument(
        "--run_only",
        "--run-only",
        nargs="+",
        default=None,
        metavar="REGEX",
        help="only the steps whose names match (and the steps they depend on)",
    )
    parser.add_argument(
        "--force_run_failed",
        "--force-run-failed",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="rerun steps whose last attempt FAILED (default: true; false refuses to run)",
    )
    if isinstance(config, ExecutorMainConfig):
        parser.set_defaults(
            prefix=config.prefix,
            dry_run=config.dry_run,
            force_run_failed=config.force_run_failed,
            run_only=config.run_only,
        )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    steps = list(getattr(config, "steps", None) or steps)
    if not steps:
        parser.error("executor_main: no steps given (executor_main(steps=[...]))")
    try:
        return StepRunner(prefix=args.prefix).run(
            steps,
            dry_run=args.dry_run,
            run_only=args.run_only,
            force_run_failed=args.force_run_failed,
            force=force,
            instance=instance,
            resources=resources,
        )
    except (PlanError, DuplicateAssetError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")  # a flag's mistake, not a traceback
