"""`versioned_asset`: the one helper every asset factory uses.

A factory supplies a name, a config and `run(config, inputs, output_path,
step)`; this module derives the version, the output path, the Dagster asset
(code_version = version, DataVersion = manifest hash) and the skip, lease and
status handling around `run`.
"""

# No `from __future__ import annotations`: Dagster reads the compute function's annotations.

import contextlib
import dataclasses
import logging
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
import pydantic

from marin_dagster import fs
from marin_dagster.execution.lease import LeaseSettings, holder_gone
from marin_dagster.execution.origins import note_origins
from marin_dagster.execution.status import StatusRecord, StepStatus, read_status
from marin_dagster.execution.step import changed_inputs, execute_step
from marin_dagster.execution.tags import FORCE_TAG, check_run_tags
from marin_dagster.execution.version import StepConfig, compute_version
from marin_dagster.iris import ResourceConfig, iris_placement_metadata
from marin_dagster.settings import parse_bool
from marin_dagster.words import a_type, unknown_keyword

# The step's version: in the asset's metadata, and in its op tags, so that a run's plan
# records the version its launcher loaded.
VERSION_TAG = "marin/version"


class StepRunConfig(dg.Config):
    """Run config of every versioned asset."""

    force: bool = False
    """Rerun even if the output already holds SUCCESS for this version."""


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What `run` gets besides its config: the Dagster log, resources and run id."""

    name: str
    version: str
    run_id: str
    log: logging.Logger | Any
    resources: Any
    dagster: dg.AssetExecutionContext


@dataclasses.dataclass(frozen=True)
class Step:
    """A versioned step behind an asset: what the registry keeps per asset key."""

    name: str
    kind: str
    version: str
    config: Any
    upstream: Mapping[str, "Step"]
    asset: dg.AssetsDefinition
    defined_at: str = ""
    """Where the experiment called the factory (`file:line`), for errors naming the definition."""
    source_state: Callable[[Any], Mapping[str, str]] | None = None
    """What the step reads that is neither in its version nor another step's output (a
    watched folder's files), fingerprinted: see `versioned_asset`."""
    observed: bool = False
    """A source observed where it is (a watched folder), with no output of its own: what
    reads it fingerprints it as its `source_state`."""
    nothing_to_build: Callable[[Any], str | None] | None = None
    """Why there is nothing to build now (an empty inbox), or None: see `versioned_asset`."""

    def why_nothing_to_build(self) -> str | None:
        """Why a run would build nothing here now (and skip the steps after it), or None."""
        return self.nothing_to_build(self.config) if self.nothing_to_build else None

    def built_from(self, output_path: Callable[[str, str], str]) -> dict[str, str]:
        """What the step would be built from now, as its SUCCESS records it: each input's
        data version ("" for one not built) and its source state. `output_path(name,
        version)` is the storage's."""
        out = {}
        for role, up in self.upstream.items():
            if up.observed:
                continue
            record = read_status(output_path(up.name, up.version))
            done = record is not None and record.status == StepStatus.SUCCESS
            out[role] = (record.data_version or "") if done else ""
        if self.source_state is not None:
            out.update(self.source_state(self.config))
        return out

    def changed_inputs(
        self, record: StatusRecord, output_path: Callable[[str, str], str]
    ) -> list[str]:
        """The inputs that changed since `record` (a SUCCESS of this step) was built. An input
        not built now (being rebuilt, or its rebuild killed) is not one: what it will hold is
        not known until it is, and the run compares then."""
        now = self.built_from(output_path)
        changed = changed_inputs(record, now, reads_source=self.source_state is not None)
        return [role for role in changed if not (role in self.upstream and now[role] == "")]


Run = Callable[[Any, Mapping[str, str], str, StepContext], Mapping[str, Any] | None]

# Factories register each asset here so that experiments only list their
# leaves: the graph is found by following `upstream` references. Keyed by the
# object, not the asset key: a key may be rebuilt with another config (in a
# notebook, a test) while older downstream assets still point at the old one.
_STEPS: dict[int, Step] = {}


# A name is a relative path below the prefix: its output is `{prefix}/{name}-{version}`.
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_name(name: str) -> str:
    """`name` if it is a safe relative asset name, else a ValueError saying why."""
    parts = name.split("/") if isinstance(name, str) else []
    bad = [p for p in parts if p in (".", "..") or not _NAME_PART.fullmatch(p)]
    if not parts or bad:
        raise ValueError(
            f"asset name {name!r} is not allowed: a name is parts of letters, digits, '_', '-' and "
            "'.' joined by '/' (e.g. 'tokenized/shakespeare'), with no empty, '.' or '..' part and "
            "no leading '/', because it becomes the output path {prefix}/{name}-{version}"
            + (f"; offending part(s): {bad}" if bad else "")
        )
    return name


# Dagster's graph, catalog and CLI show an asset by its key's last part, so with plain
# names the raw, the deduplicated and the tokenized corpus would all read "shakespeare".
# The last part carries what the asset is: raw/shakespeare -> raw/shakespeare_raw.
KIND_LABELS: Mapping[str, str] = {
    "sample_corpus": "raw",
    "dataset": "raw",
    "folder_corpus": "raw",
    "watched_folder": "files",
    "deduplicated": "dedup",
    "tokenizer": "tokenizer",
    "tokenized": "tokens",
    "train_lm": "checkpoint",
    "evaluate": "eval",
    "dataset_stats": "stats",
}


def asset_key(name: str, kind: str | None = None) -> dg.AssetKey:
    """The asset key of step `name`: its parts, the last one suffixed with the kind's label."""
    parts = check_name(name).split("/")
    label = KIND_LABELS.get(kind or "")
    if label and not parts[-1].endswith(label):
        parts[-1] = f"{parts[-1]}_{label}"
    return dg.AssetKey(parts)


def caller_frame() -> Any:
    """The frame of the first caller outside the factories and this package: the
    experiment's code (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        factory = module == "assets" or (
            module.startswith("assets.") and not module.startswith("assets.experiments")
        )
        if not (module.startswith("marin_dagster.") or factory):
            return frame
        frame = frame.f_back
    return None


def _defined_at() -> str:
    """`file:line` where the experiment defined the step."""
    frame = caller_frame()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "<unknown>"


@contextlib.contextmanager
def defining(factory: str, name: str) -> Iterator[None]:
    """Errors in a factory's arguments name the factory and the asset, at definition time."""
    prefix = f"{factory}({name!r}): "
    try:
        yield
    except pydantic.ValidationError as e:
        raise ValueError(prefix + _field_errors(e)) from None
    except (ValueError, TypeError) as e:
        if str(e).startswith(prefix):
            raise
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(prefix + str(e)) from None


def _config_fields(title: str) -> list[str]:
    """The fields of the step config class named `title` (a ValidationError names its model,
    not the class)."""
    classes: list[type] = [StepConfig]
    while classes:
        cls = classes.pop()
        if cls.__name__ == title:
            return list(cls.model_fields)
        classes.extend(cls.__subclasses__())
    return []


def _field_errors(e: pydantic.ValidationError) -> str:
    """Pydantic's errors in a line per field; a misspelt keyword with its likely fix."""
    lines = []
    for err in e.errors():
        field = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(unknown_keyword(field, _config_fields(e.title)))
        else:
            lines.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(lines)


class DuplicateAssetError(ValueError):
    """Two different steps (configs or inputs) were given the same asset name."""

    def __init__(self, first: Step, second: Step, where: str = "") -> None:
        what = "different configs" if first.kind == second.kind else "different kinds of step"

        def at(step: Step) -> str:
            kind = "" if first.kind == second.kind else f"{step.kind}, "
            return f"{step.defined_at} ({kind}version {step.version})"

        super().__init__(
            f"asset {first.name!r} is defined twice with {what}{where}: at {at(first)} and at "
            f"{at(second)}. One name is one output, one Dagster asset (where Marin keeps a "
            "name-<hash> output per config): give each its own name, such as "
            f"'{first.name}-<what differs>', or reuse one definition in both places"
        )


def claim_name(steps: dict[str, Step], step: Step) -> None:
    """Add `step` to `steps` (by name, as outputs go); a different step of that name is a
    DuplicateAssetError, where a dict by name kept the last one without a word."""
    known = steps.setdefault(step.name, step)
    if known.version != step.version:
        raise DuplicateAssetError(known, step)


def asset_list(value: Any, field: str) -> list[Any]:
    """The assets of an argument that takes a list; one asset given alone, or anything else,
    is refused naming `field` (it failed with "'AssetsDefinition' object is not iterable")."""
    if isinstance(value, dg.AssetsDefinition) or hasattr(value, "as_asset"):
        step = _STEPS.get(id(value))
        one = step.name if step else getattr(value, "name", None) or value.key.to_user_string()
        raise TypeError(
            f"{field} takes a list of assets, got one asset ({one}): "
            f"put it in brackets, {field}=[...]"
        )
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{field} takes a list of assets, got {a_type(value)}")
    return list(value)


def steps_by_name(assets: Iterable[Any], role: str) -> dict[str, Step]:
    """The steps of `assets` by name (`claim_name`); `role` names the argument in errors."""
    steps: dict[str, Step] = {}
    for asset in assets:
        claim_name(steps, step_for(asset, role))
    return steps


def _force_tag(tags: Mapping[str, str]) -> bool:
    check_run_tags(tags)
    value = tags.get(FORCE_TAG)
    if not value:
        return False
    try:
        return parse_bool(value)
    except ValueError:
        # a value read as false would skip every step of a run meant to redo them
        raise ValueError(f"run tag {FORCE_TAG}={value!r}: set it to true or false") from None


def register_step(step: Step) -> None:
    """Make `step.asset` findable by reference (`step_for`), as every factory's asset is.

    For factories that build their asset without `versioned_asset` (a watched folder) or
    change it after (`map_asset_specs` returns a new object).
    """
    _STEPS[id(step.asset)] = step
    # A file of steps is a code location as it is (`dagster dev -f exp.py`).
    from assets.location import attach_caller

    attach_caller()


def is_registered(asset: Any) -> bool:
    return id(asset) in _STEPS and _STEPS[id(asset)].asset is asset


def step_for(asset: Any, role: str = "") -> Step:
    """The step behind a factory's asset, or behind a Marin `ExecutorStep` (lowered).
    `role` (an argument's name) goes into the error when `asset` is no step at all."""
    if not isinstance(asset, dg.AssetsDefinition) and hasattr(asset, "as_asset"):
        asset = asset.as_asset()
    if not isinstance(asset, dg.AssetsDefinition):
        raise TypeError(
            f"{role + ' ' if role else ''}{asset!r} ({type(asset).__name__}) is not a step: "
            "pass what a factory returned (`notes = dataset(...)`, then `source=notes`); "
            "a file or folder becomes a step with `dataset(name, path)`"
        )
    try:
        return _STEPS[id(asset)]
    except KeyError:
        raise ValueError(
            f"{asset.key.to_user_string()} was not made by a marin factory, so it has no version "
            "to depend on; build it with a factory from `assets`"
        ) from None


def upstream_closure(leaves: Sequence[dg.AssetsDefinition]) -> list[Step]:
    """The leaves and everything upstream of them, upstream first."""
    # By name, not asset key: steps of two kinds named alike have different keys (the kind's
    # suffix) but share the name that outputs, `marin status` and `marin sql` go by. The
    # version hashes the kind, so equal versions mean one step.
    seen: dict[str, Step] = {}

    def visit(step: Step) -> None:
        if step.name in seen:
            claim_name(seen, step)  # the same step again, or a DuplicateAssetError
            return
        for up in step.upstream.values():
            visit(up)
        claim_name(seen, step)  # an upstream step may have taken the name (`notes` on `notes`)

    for leaf in leaves:
        visit(step_for(leaf, "leaf"))
    check_op_names(seen.values())
    return list(seen.values())


def check_op_names(steps: Iterable[Step]) -> None:
    """Dagster names an asset's op after its key, with '-' and '.' read as '_': two steps
    named so (raw/a-b, raw/a_b) are one node to it, and the location fails to load naming
    neither definition."""
    ops: dict[str, Step] = {}
    for step in steps:
        op = step.asset.key.to_python_identifier()
        first = ops.setdefault(op, step)
        if first.name != step.name:
            raise ValueError(
                f"asset names {first.name!r} (at {first.defined_at}) and {step.name!r} (at "
                f"{step.defined_at}) are one name to Dagster, which names an asset's op "
                f"{op!r} with '-' and '.' read as '_': rename one of them"
            )


# -- metadata: what run returns, kept JSON-ready in the status file ---------
_MD_KINDS: dict[type, str] = {
    dg.MarkdownMetadataValue: "md",
    dg.PathMetadataValue: "path",
    dg.UrlMetadataValue: "url",
    dg.JsonMetadataValue: "json",
}


def metadata_to_json(metadata: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        kind = _MD_KINDS.get(type(value))
        if kind is not None:
            out[key] = {"__metadata__": kind, "value": value.value}
        elif isinstance(value, dg.MetadataValue):
            out[key] = value.value
        elif isinstance(value, bool | int | float | str) or value is None:
            out[key] = value
        else:
            raise TypeError(f"metadata {key!r}: {type(value).__name__} is not JSON-ready metadata")
    return out


def metadata_from_json(metadata: Mapping[str, Any]) -> dict[str, Any]:
    makers = {
        "md": dg.MetadataValue.md,
        "path": dg.MetadataValue.path,
        "url": dg.MetadataValue.url,
        "json": dg.MetadataValue.json,
    }
    out = {}
    for key, value in metadata.items():
        if isinstance(value, dict) and value.get("__metadata__") in makers:
            out[key] = makers[value["__metadata__"]](value["value"])
        else:
            out[key] = value
    return out


def _code_location_args(run: Any, defined_at: str) -> str:
    """The `dagster` CLI's arguments for the code location `run` came from (`-f exp.py`,
    `-m module`); for a run from a script or a test, the file that defined the step, which is
    a code location too."""
    origin = getattr(run, "job_code_origin", None)
    pointer = getattr(getattr(origin, "repository_origin", None), "code_pointer", None)
    if getattr(pointer, "python_file", None):
        return f"-f {shlex.quote(pointer.python_file)}"
    if getattr(pointer, "module", None):
        return f"-m {pointer.module}"
    return f"-f {shlex.quote(defined_at.rpartition(':')[0])}"


def _check_prefix(storage: Any, run: Any) -> None:
    # A run launched from a code location (the CLI, the UI) runs its steps in processes of
    # their own: what one writes to memory:// vanishes with it, and the next cannot read it.
    if storage.prefix.startswith("memory://") and getattr(run, "job_code_origin", None):
        raise dg.Failure(
            f"the prefix {storage.prefix} keeps outputs in one process's memory, and this run "
            "came from the dagster CLI or UI, whose steps run in processes of their own: set "
            "MARIN_PREFIX to a folder or gs://... (memory:// is for a script's own process: "
            "`python exp.py`, tests)"
        )


def _check_loaded_version(context: dg.AssetExecutionContext, name: str, version: str) -> None:
    """Warn when this step's version differs from the one the run was launched with.

    `dagster dev` keeps the experiment as it loaded it, while each run loads the file
    again: a file (or a local source) edited without "Reload" runs as it is now, under a
    version the UI has not seen, and the asset then shows as changed with no hint why.
    The version the launcher saw is in the run's plan, as the step's op tag."""
    snapshot_id = context.run.execution_plan_snapshot_id
    if not snapshot_id:
        return
    plan = context.instance.get_execution_plan_snapshot(snapshot_id)
    key = context.get_step_execution_context().step.key
    launched = next((s.tags or {} for s in plan.steps if s.key == key), {}).get(VERSION_TAG)
    if launched and launched != version:
        context.log.warning(
            f"{name}: this run loaded version {version} of it, not {launched}, the version its "
            "code location had loaded when the run was launched: the experiment file (or a "
            f"local source it reads) changed since. The run builds {version}. Reload the code "
            "location (the UI's Reload, or restart `dagster dev`) to see it as it is now."
        )


def _being_written(path: str, record: StatusRecord | None) -> bool:
    return record is not None and record.status == StepStatus.RUNNING and not holder_gone(path)


def _input_paths(
    storage: Any, upstream: Mapping[str, Step], location: str, key: dg.AssetKey, log: Any
) -> dict[str, str]:
    """Each input's output folder; one not built fails, saying how to build this step with
    everything it needs (`+key`: every missing input, not only the first one found). One
    that another live run is writing (a rebuild, a run launched beside this one) is waited
    for, as a step waits for its own output: it failed, advising to build what was being built."""
    inputs = {}
    for role, up in upstream.items():
        path = storage.output_path(up.name, up.version)
        record = read_status(path)
        if _being_written(path, record):
            log.info(f"input {role!r} ({up.name}) is being written by another run: waiting")
            while _being_written(path, record):
                time.sleep(LeaseSettings().poll_s)
                record = read_status(path)
        if record is None or record.status != StepStatus.SUCCESS:
            state = record.status.value if record else "missing"
            if record is not None and record.status == StepStatus.RUNNING:
                state = "RUNNING, interrupted (the run writing it was killed)"
            raise dg.Failure(
                f"input {role!r} ({up.name}) is {state} at {path}; materialize it first, "
                "e.g. with this step and all it needs: "
                f"`dagster asset materialize {location} --select '+{key.to_user_string()}'`"
            )
        inputs[role] = path
    return inputs


def versioned_asset(
    *,
    name: str,
    kind: str,
    config: Any,
    run: Run,
    upstream: Mapping[str, dg.AssetsDefinition] | None = None,
    description: str = "",
    resources: str | ResourceConfig = "cpu",
    required_resources: Sequence[str] = (),
    kinds: Sequence[str] = (),
    label: str | None = None,
    nothing_to_build: Callable[[Any], str | None] | None = None,
    source_state: Callable[[Any], Mapping[str, str]] | None = None,
    data_folder: str | None = None,
) -> dg.AssetsDefinition:
    """A Dagster asset for a versioned step writing `{prefix}/{name}-{version}`.

    `resources` ("cpu", "gpu:h100x8", "tpu:v5e-8", ...) is what the step needs; it is
    not part of the version and lands in the asset's op tags for the Iris executor.
    `label` (e.g. train_lm's `version="v1"`) is a user's own tag that enters the version.
    `nothing_to_build(config)` says why there is nothing to build yet (an empty inbox), or
    None: with a reason the step materializes nothing and the steps after it are skipped,
    as Dagster skips what follows an optional output left out (not a failure).
    `source_state(config)` fingerprints what the step reads that is not another step's
    output and not in its version (a watched folder's files): recorded with SUCCESS beside
    the inputs' data versions, and a change rebuilds the output (`execute_step`'s `inputs`).
    `data_folder` is the folder of the output that the steps after it read, where the rest is
    bookkeeping: only a change there rebuilds them.
    """
    step_config = config
    key = asset_key(name, kind)
    with defining(kind, name):  # the factory is named as its kind
        upstream_steps = {role: step_for(asset, role) for role, asset in (upstream or {}).items()}
    version = compute_version(
        kind, config, {role: s.version for role, s in upstream_steps.items()}, label=label
    )

    defined_at = _defined_at()

    def compute(context: dg.AssetExecutionContext, config: StepRunConfig) -> dg.MaterializeResult:
        storage = context.resources.storage
        _check_prefix(storage, context.run)
        output_path = storage.output_path(name, version)
        location = _code_location_args(context.run, defined_at)
        _check_loaded_version(context, name, version)
        inputs = _input_paths(storage, upstream_steps, location, key, context.log)
        force = config.force or _force_tag(context.run.tags)
        run_id = context.run.run_id
        step = StepContext(name, version, run_id, context.log, context.resources, context)

        def work(path: str) -> dict[str, Any]:
            fs.makedirs(path)
            try:
                return metadata_to_json(run(step_config, inputs, path, step) or {})
            except Exception as e:
                note_origins(e, inputs, {role: s.name for role, s in upstream_steps.items()})
                raise

        outcome = execute_step(
            output_path,
            version,
            work,
            force=force,
            lease=storage.lease_settings(),
            run_id=run_id,
            log=context.log,
            inputs=registered.built_from(storage.output_path),
            reads_source=registered.source_state is not None,
            data_folder=data_folder,
        )
        files = outcome.manifest.get("files", {})
        return dg.MaterializeResult(
            data_version=dg.DataVersion(outcome.data_version),
            metadata={
                **metadata_from_json(outcome.metadata),
                "version": version,
                "path": dg.MetadataValue.path(output_path),
                "skipped": outcome.skipped,
                "output_files": len(files),
                "output_bytes": sum(f["size"] for f in files.values()),
                # where this materialization ran (not where the skipped work once ran)
                **iris_placement_metadata(),
            },
        )

    def optional(context: dg.AssetExecutionContext, config: StepRunConfig):
        reason = registered.why_nothing_to_build()
        if reason:
            output_path = context.resources.storage.output_path(name, version)
            before = read_status(output_path)
            kept = (
                f"; the output built before stays as it was at {output_path}"
                if before is not None and before.status == StepStatus.SUCCESS
                else ""
            )
            context.log.warning(
                f"{name}: nothing to build: {reason}; skipped, with what follows{kept}"
            )
            return
        yield compute(context, config)

    asset = dg.asset(
        key=key,
        code_version=version,
        deps=[s.asset.key for s in upstream_steps.values()],
        description=f"{description}\n\nVersion `{version}`: output `{{prefix}}/{name}-{version}`.".strip(),
        required_resource_keys={"storage", *required_resources},
        op_tags={**ResourceConfig.parse(resources).to_op_tags(), VERSION_TAG: version},
        metadata={"marin/kind": kind, VERSION_TAG: version},
        kinds=set(kinds) or None,
        output_required=nothing_to_build is None,
    )(compute if nothing_to_build is None else optional)
    registered = Step(
        name,
        kind,
        version,
        config,
        upstream_steps,
        asset,
        defined_at,
        source_state,
        nothing_to_build=nothing_to_build,
    )
    register_step(registered)
    return asset
