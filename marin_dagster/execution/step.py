"""Run one versioned step with Marin's skip_existing semantics.

    SUCCESS at this version  -> skipped, same data version re-emitted; rebuilt instead
                                when its inputs are no longer what it was built from
    RUNNING with a live lease -> wait for it (then usually skip), or fail naming the holder
    FAILED, missing, stale    -> run; the step's own code resumes what it finished

The status is written last, after the manifest, so a killed run never leaves
an output that reads as finished.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from marin_dagster import fs
from marin_dagster.execution import previous
from marin_dagster.execution.lease import Lease, LeaseSettings
from marin_dagster.execution.status import (
    MANIFEST_FILE,
    RUN_STOPPED,
    StatusRecord,
    StepStatus,
    build_manifest,
    data_version_of,
    read_status,
    write_status,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    output_path: str
    version: str
    data_version: str
    skipped: bool
    metadata: dict[str, Any]
    manifest: dict[str, Any]


def _done(output_path: str, version: str) -> StatusRecord | None:
    record = read_status(output_path)
    if record is None or record.status != StepStatus.SUCCESS:
        return None
    if record.version != version:
        raise ValueError(
            f"{output_path} holds version {record.version}, not {version}: the path and the "
            "status disagree, so the output was moved or edited by hand; delete it to rerun"
        )
    return record


def changed_inputs(
    record: StatusRecord, inputs: Mapping[str, str] | None, *, reads_source: bool = False
) -> list[str]:
    """The inputs that differ from those `record` was built from (none when either is unknown).

    A record written before inputs were recorded is not rebuilt for that alone, unless the
    step `reads_source` (a watched folder's files): its version does not hold them, and what
    once forced its rebuild on a change (the sensor's runs) now relies on these records.
    """
    if inputs is None:
        return []
    if record.inputs is None:
        return sorted(inputs) if reads_source else []
    return sorted(
        k for k in set(inputs) | set(record.inputs) if inputs.get(k) != record.inputs.get(k)
    )


def _skipped(output_path: str, record: StatusRecord) -> StepOutcome:
    manifest = fs.read_json_or_none(fs.join(output_path, MANIFEST_FILE)) or {"files": {}}
    return StepOutcome(
        output_path, record.version, record.data_version or "", True, record.metadata, manifest
    )


def execute_step(
    output_path: str,
    version: str,
    run: Callable[[str], dict[str, Any] | None],
    *,
    force: bool = False,
    lease: LeaseSettings | None = None,
    run_id: str | None = None,
    log: logging.Logger | Any = logger,
    inputs: Mapping[str, str] | None = None,
    reads_source: bool = False,
    data_folder: str | None = None,
) -> StepOutcome:
    """Run `run(output_path)` unless the output is already done; returns what happened.

    `run` returns JSON-ready metadata; it is kept in the status file so that a
    skipped materialization reports the same counts as the one that did the work.
    `inputs` (role -> data version or content hash) is recorded with SUCCESS; a later
    call whose inputs differ rebuilds the output. Versions hash configs, so an input
    rebuilt at the same version with other data (a watched folder's files changed) would
    otherwise leave this output built from the old data and skipped for good.
    `reads_source`: see `changed_inputs`. `data_folder`: the folder of the output that the
    steps after it read, the one its data version digests (`data_version_of`).
    """

    def done() -> StatusRecord | None:
        nonlocal force
        record = _done(output_path, version)
        if record is not None and (
            changed := changed_inputs(record, inputs, reads_source=reads_source)
        ):
            log.info(
                f"{output_path}: input(s) {', '.join(changed)} changed since it was built: "
                "rebuilding"
            )
            force = True
            return None
        return record

    if not force and (record := done()) is not None:
        log.info(f"{output_path} is already SUCCESS at version {version}: skipping")
        return _skipped(output_path, record)
    with Lease(output_path, lease, run_id=run_id, log=log) as held:
        # Another run may have finished the work while we waited for the lease.
        if not force and (record := done()) is not None:
            log.info(f"{output_path} was finished by another run while waiting: skipping")
            return _skipped(output_path, record)
        if force:
            log.info(
                f"rebuilding {output_path}; the output it held is kept in "
                f"{previous.PREVIOUS_DIR}/ until the rebuild succeeds"
            )
            previous.set_aside(output_path)
        write_status(output_path, StatusRecord(StepStatus.RUNNING, version, run_id=run_id))
        try:
            metadata = run(output_path) or {}
            held.check()
            manifest = build_manifest(output_path)
            fs.write_json(fs.join(output_path, MANIFEST_FILE), manifest)
            data_version = data_version_of(manifest, data_folder)
            write_status(
                output_path,
                StatusRecord(
                    StepStatus.SUCCESS,
                    version,
                    data_version=data_version,
                    run_id=run_id,
                    metadata=metadata,
                    inputs=dict(inputs) if inputs is not None else None,
                ),
            )
            previous.discard(output_path)
        except BaseException as e:
            if not _put_back(output_path, held, log):
                _record_failure(output_path, version, run_id, e, held, log)
            raise
    return StepOutcome(output_path, version, data_version, False, metadata, manifest)


def _put_back(output_path: str, held: Lease, log: logging.Logger | Any) -> bool:
    """After a failed rebuild, the output it replaced (see `previous`); False if none."""
    try:
        if not held.holds() or not previous.restore(output_path, log):
            return False
    except Exception as e:
        log.warning(f"{output_path}: could not put back the output it held ({e})")
        return False
    log.warning(
        f"{output_path}: the rebuild failed; the output it held before is back in place "
        "(materialize again once the cause below is fixed)"
    )
    return True


def _describe(error: BaseException) -> str:
    # An interrupt has no message: "DagsterExecutionInterruptedError: " said nothing.
    interrupted = isinstance(error, KeyboardInterrupt) or "Interrupt" in type(error).__name__
    text = str(error) or (RUN_STOPPED if interrupted else "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _record_failure(
    output_path: str,
    version: str,
    run_id: str | None,
    error: BaseException,
    held: Lease,
    log: logging.Logger | Any,
) -> None:
    """Write FAILED with the step's error, unless another run took the output over.

    Whatever broke the step (a full disk, a lost bucket) may break this write too; its error
    must not replace the step's own, which says what to fix. The output then stays RUNNING
    without a live lease, which the next run takes over like a killed run's.
    """
    try:
        if not held.holds():  # never overwrite the status of the run that took over
            return
        write_status(
            output_path,
            StatusRecord(
                StepStatus.FAILED,
                version,
                run_id=run_id,
                # with its notes (which original a failing copy came from)
                error="\n".join([_describe(error), *getattr(error, "__notes__", ())]),
            ),
        )
    except Exception as e:
        log.warning(
            f"{output_path}: could not record the step's failure ({type(e).__name__}: {e}); "
            "it stays RUNNING until the next run takes it over"
        )
