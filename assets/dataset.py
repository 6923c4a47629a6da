"""Raw datasets from anywhere: `dataset(name, source, ...)` and `as_dataset(source)`.

    web   = dataset("raw/web", "gs://bucket/web/*.jsonl.zst")
    local = dataset("raw/notes", "~/corpus", text_key="body")
    tiny  = dataset("raw/tinystories", "roneneldan/TinyStories", split="train")
    c4    = dataset("raw/c4-en", "allenai/c4", subset="en", files="en/c4-train.0000*-of-01024.json.gz")

The source is resolved when the experiment is loaded (see marin_dagster/datasets/sources.py):
its files, sizes and content identities (and the hub's commit) enter the version, so a
changed source changes this asset's version and every version downstream, and an unchanged
one skips. The output holds the source's files under their relative names, verified.

Hugging Face options use the hub's words: `revision` (branch, tag or commit), `subset` (what
`datasets.load_dataset` calls the config name, `name=`), `split`, and `files` (glob patterns
on the repo's paths, like `data_files`). `split=None` takes every split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from marin_dagster.datasets.sources import (
    SAMPLE_RECORDS,
    ResolvedSource,
    SourceError,
    fetch_summary,
    parse_source,
    preview,
    resolve,
)
from marin_dagster.datasets.tasks import RESOLVED, Fetched, FetchJob, fetch_one
from marin_dagster.ducky import catalog
from marin_dagster.execution.asset import StepContext, check_name, step_for, versioned_asset
from marin_dagster.execution.origins import write_origins
from marin_dagster.execution.version import StepConfig, unversioned
from marin_dagster.iris import ResourceConfig
from marin_dagster.zephyr import Dataset, InputError, ShardFailedError

# Counting documents reads every JSON lines or CSV file once more; past this size the count
# is left out of the metadata (Parquet counts come from the footers whatever the size).
COUNT_DOCUMENTS_MAX_BYTES = 2 << 30
MANIFEST_METADATA_FILES = 100


# A copy of the user's folder: every data file at any depth is one table, whatever its
# format (top-level files beside a subfolder's: the view held only the top level's).
catalog.register_kind("dataset", files="*")


class DatasetConfig(StepConfig):
    source: str
    """The source as given (path, URL or hub id)."""
    kind: str
    location: str
    """The resolved location: URL or hub repo id; for a local source, the path as given
    (`path` holds it resolved)."""
    revision: str | None = None
    subset: str | None = None
    split: str | None = None
    files: tuple[str, ...] = ()
    format: str | None = None
    content: str
    """Digest of the source's files (names, sizes, content identities) when it was resolved."""
    text_key: str = unversioned("text")
    """The records' text field: checked, not written, so not part of the version."""
    resolved_revision: str | None = unversioned(None)
    """The hub commit the files were listed at. The content digest is in the version instead:
    a commit that leaves the selected files as they were does not re-download them."""
    path: str | None = unversioned(None)
    """A local source's absolute path, resolved at load time against this machine's working
    folder and home: the same relative or `~` source in another clone, working folder or
    account names the same files (`content` says whether they are), so it is not in the
    version."""


def _spec(config: DatasetConfig) -> Any:
    # A local path as resolved at load time: the run may start in another working folder.
    return parse_source(
        config.path if config.kind == "local" and config.path else config.source,
        revision=config.revision,
        subset=config.subset,
        split=config.split,
        files=config.files or None,
        format=config.format,
    )


def _preview_markdown(rows: list[dict]) -> str:
    lines = ["| file | chars | opening |", "|---|---|---|"]
    for r in rows:
        opening = r["opening"].replace("|", "\\|")
        lines.append(f"| {r['file']} | {r['chars']:,} | {opening} |")
    return "\n".join(lines)


def _run(
    config: DatasetConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    spec = _spec(config)
    if config.kind == "hub" and config.resolved_revision:
        # the commit listed at load time: a branch that moved since still fetches what the
        # version was computed from
        spec = dataclasses.replace(spec, revision=config.resolved_revision)
    resolved = resolve(spec)
    if resolved.content_hash() != config.content:
        raise SourceError(
            config.source,
            f"the source changed since this code location was loaded (content "
            f"{config.content} then, {resolved.content_hash()} now); reload the code location "
            "(or rerun the script) so the asset gets the version of the new content",
        )
    if resolved.left_out:
        step.log.warning(
            f"{config.source}: {len(resolved.left_out)} file(s) left out, their extension names "
            f"no format the dataset reads{' as ' + config.format if config.format else ''}: "
            f"{', '.join(resolved.left_out[:10])}{' ...' if len(resolved.left_out) > 10 else ''}"
            ". Rename them (.jsonl, .parquet, .csv), or give format= and files= to read them."
        )
    result = _fetch(resolved, config, output_path, step)
    write_origins(output_path, {f.name: resolved.origin(f) for f in resolved.files})
    meta: dict[str, Any] = {
        "source": spec.describe(),
        "files": len(result.files),
        "bytes": resolved.bytes,
        "downloaded_files": len(result.downloaded),
        "resumed_files": len(result.resumed),
        "text_key": config.text_key,
        "preview": dg.MetadataValue.md(_preview_markdown(preview(result.files, config.text_key))),
        # the first files only: the status file keeps the metadata, and sources can hold
        # many thousands of files
        "source_files": dg.MetadataValue.json(resolved.manifest()[:MANIFEST_METADATA_FILES]),
    }
    if resolved.revision:
        meta["revision"] = resolved.revision
    if resolved.left_out:
        meta["left_out_files"] = dg.MetadataValue.json(list(resolved.left_out[:100]))
    if result.documents is not None:
        meta["documents"] = result.documents
    if result.broken:
        meta["broken_lines_sampled"] = len(result.broken)
        meta["broken_lines"] = dg.MetadataValue.json(result.broken[:20])
    return {**meta, **step.resources.zephyr.metadata(result.zephyr, writes=False)}


@dataclasses.dataclass(frozen=True)
class _Fetched:
    files: list[str]
    downloaded: list[str]
    resumed: list[str]
    documents: int | None
    broken: list[str]  # broken lines met in each file's first records
    zephyr: Any


def _fetch(
    resolved: ResolvedSource, config: DatasetConfig, output_path: str, step: StepContext
) -> _Fetched:
    """Every file fetched, verified, checked and counted in one Zephyr task per file, on the
    ZephyrResource's backend and workers."""
    count = resolved.bytes <= COUNT_DOCUMENTS_MAX_BYTES or all(
        f.format == "parquet" for f in resolved.files
    )
    jobs = [
        FetchJob(i, output_path, config.text_key, count, config.source)
        for i in range(len(resolved.files))
    ]
    pipeline = Dataset.from_list(jobs).reshard(len(jobs)).map(fetch_one)
    zephyr = step.resources.zephyr
    try:
        ran = zephyr.execute(
            pipeline, context=step.dagster, shared={RESOLVED: resolved}, output_path=output_path
        )
    except ShardFailedError as e:
        # A source that cannot be fetched or read is the user's to fix: report it as itself.
        if isinstance(e.__cause__, SourceError | InputError):
            raise e.__cause__ from None
        raise
    answers: list[Fetched] = ran.results
    summary = fetch_summary(resolved, [a.fetch for a in answers], step.log)
    if sum(a.checked for a in answers) == 0:
        raise SourceError(
            config.source,
            f"the source is empty: its {len(answers)} file(s) hold no records; add data or "
            "point at another source",
        )
    broken = [line for a in answers for line in a.broken]
    if broken:
        step.log.warning(
            f"{len(broken)} broken line(s) among the first {SAMPLE_RECORDS} records of each "
            f"file, e.g. {broken[0]}. The dataset is fetched as it is: a step reading it fails "
            "on such a line unless it skips bad records (tokenizer and tokenized: "
            "skip_bad_records=True). Or fix the original, which gives the dataset a new version."
        )
    documents = sum(a.records for a in answers) if count else None
    return _Fetched(summary.files, summary.downloaded, summary.resumed, documents, broken, ran)


def dataset(
    name: str,
    source: str,
    *,
    revision: str | None = None,
    subset: str | None = None,
    split: str | None = None,
    files: str | Sequence[str] | None = None,
    format: str | None = None,
    text_key: str = "text",
    resources: str | ResourceConfig = "cpu",
) -> dg.AssetsDefinition:
    """A raw dataset fetched from `source` (local path/folder/glob, fsspec URL, http(s) URL,
    or Hugging Face dataset id), verified, into `{prefix}/{name}-{version}`.

    `format` ("jsonl", "parquet", "csv") is needed only where file extensions do not say it.
    Errors in the source (not found, bad revision, empty, unknown format) are raised here,
    naming the source. When the asset runs, the first 100 records of each file are read
    (before SUCCESS: a text field missing from those, or a broken line, fails it); a record
    further on is checked by the steps that read its text, which name its line.
    """
    check_name(name)
    try:
        spec = parse_source(
            source, revision=revision, subset=subset, split=split, files=files, format=format
        )
        resolved = resolve(spec)
    except SourceError as e:
        raise SourceError(e.source, e.detail, factory=f"dataset({name!r})") from None
    cfg = DatasetConfig(
        source=source,
        kind=spec.kind,
        location=source if spec.kind == "local" else spec.location,
        path=spec.location if spec.kind == "local" else None,
        revision=spec.revision,
        subset=subset,
        split=split,
        files=spec.files,
        format=format,
        content=resolved.content_hash(),
        text_key=text_key,
        resolved_revision=resolved.revision,
    )
    at = f" at {resolved.revision[:12]}" if resolved.revision else ""
    return versioned_asset(
        name=name,
        kind="dataset",
        config=cfg,
        run=_run,
        description=f"Raw dataset from `{spec.describe()}`{at}: {len(resolved.files)} file(s), "
        f"{resolved.bytes:,} bytes, fetched and verified.",
        resources=resources,
        required_resources=("zephyr",),
        kinds=sorted({f.format for f in resolved.files}),
    )


_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _name_part(part: str) -> str:
    part = _BAD_NAME_CHARS.sub("_", part).strip(".")
    return part if part and re.match(r"[A-Za-z0-9_]", part) else f"_{part}"


def dataset_name(
    source: str,
    *,
    revision: str | None = None,
    subset: str | None = None,
    split: str | None = None,
    files: str | Sequence[str] | None = None,
    format: str | None = None,
) -> str:
    """The asset name `as_dataset` gives a source: `raw/` and the source's own parts
    (`raw/roneneldan/TinyStories`, `raw/<bucket>/<path>`, `raw/<file or folder name>`), plus
    the subset and split, plus a short hash of any glob, file pattern or revision (so two
    selections of one source are two assets)."""
    spec = parse_source(
        source, revision=revision, subset=subset, split=split, files=files, format=format
    )
    if spec.kind == "hub":
        parts = spec.location.split("/") + [p for p in (subset, split) if p]
    elif spec.kind == "local":
        path = spec.location
        fixed = [p for p in path.split("/") if p]
        globbed = next((i for i, p in enumerate(fixed) if any(c in p for c in "*?[")), None)
        fixed = fixed[:globbed] if globbed is not None else fixed
        parts = fixed[-1:] or ["local"]
    else:
        rest = spec.location.split("://", 1)[1]
        fixed = [p for p in rest.split("?")[0].split("/") if p]
        globbed = next((i for i, p in enumerate(fixed) if any(c in p for c in "*?[")), None)
        parts = fixed[:globbed] if globbed is not None else fixed
    # A relative or ~ glob as written: resolved, the name (and so the output's path) would
    # follow this machine's working folder or home.
    given = spec.given.strip()
    written = spec.kind == "local" and (given.startswith("~") or not os.path.isabs(given))
    where = given if written else spec.location
    qualifiers = [
        q
        for q in (
            where if any(c in where for c in "*?[") else "",
            ",".join(spec.files),
            spec.revision or "",
            spec.format or "",
        )
        if q
    ]
    name_parts = ["raw", *(_name_part(p) for p in parts)]
    if qualifiers:
        digest = hashlib.sha256("|".join(qualifiers).encode()).hexdigest()[:6]
        name_parts[-1] = f"{name_parts[-1]}-{digest}"
    return check_name("/".join(name_parts))


def as_dataset(
    source: str | dg.AssetsDefinition, *, text_key: str = "text", **kw: Any
) -> dg.AssetsDefinition:
    """`source` itself if it is already an asset, else `dataset(dataset_name(source), source,
    ...)`: what factories taking `source=` call so a path, URL or hub id works there too."""
    if isinstance(source, dg.AssetsDefinition) or hasattr(source, "as_asset"):
        return source  # an asset, or a Marin ExecutorStep whose output is the dataset
    if not isinstance(source, str):
        raise TypeError(
            f"a dataset source is an asset or a string (path, URL, hub id), not "
            f"{type(source).__name__}"
        )
    name_kw = {k: kw[k] for k in ("revision", "subset", "split", "files", "format") if k in kw}
    return dataset(dataset_name(source, **name_kw), source, text_key=text_key, **kw)


# Steps whose output keeps the records as they read them, text field included.
_KEEP_RECORDS = ("dataset", "deduplicated")


def records_text_key(source: Any, role: str = "source") -> str:
    """The field holding the text in `source`'s records: the one its step was given where it
    keeps the records as read (`dataset(..., text_key="body")`, a dedup of that), else "text".
    What the factories after it default to: each used "text", and failed on a dataset read
    with another field."""
    step = step_for(source, role)
    return getattr(step.config, "text_key", "text") if step.kind in _KEEP_RECORDS else "text"
