"""Raw data that arrives as files: `watched_folder` and `folder_corpus`.

    inbox  = watched_folder("raw/inbox", "/data/inbox")
    corpus = folder_corpus("raw/inbox_corpus", source=inbox)

`watched_folder` is an observable source asset: observing it hashes the
folder's files (the content hash is its data version). An experiment that
lists an asset below it gets a sensor (`assets/sensors.py`) that requests
a run of those assets when files are added, changed or deleted (none when the last
one goes: what was built from them stays).

`folder_corpus` turns the folder's text files into JSONL shards
`{id, text, source}` (id: the file's path relative to the folder; source: the
folder as written). Its version holds the folder as the experiment wrote it
(a relative folder names the same step in any clone), not its content: a materialization (the sensor's runs,
by hand, `python exp.py`) rebuilds it, and the steps after it whose inputs change,
when the files differ from those it was built from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pydantic

from marin_dagster import fs
from marin_dagster.datasets.digests import file_sha256
from marin_dagster.datasets.watch import content_hash, folder_state, ignored
from marin_dagster.execution.asset import (
    VERSION_TAG,
    Step,
    StepContext,
    asset_key,
    register_step,
    step_for,
    versioned_asset,
)
from marin_dagster.execution.version import StepConfig, compute_version, unversioned
from marin_dagster.iris import ResourceConfig
from marin_dagster.zephyr.readers import compressed_suffix


class WatchedFolderConfig(StepConfig):
    source: str
    """The folder as the experiment wrote it (relative, `~` or absolute)."""
    path: str = unversioned()
    """The folder resolved at load time against this machine's working folder and home: the
    same relative or `~` folder in another clone or account is the same step, so it is not in
    the version (the corpus records the files it read, and rebuilds when they differ)."""


WATCHED_KIND = "watched_folder"


def watched_folder(name: str, path: str, description: str = "") -> dg.AssetsDefinition:
    """An observable source asset over the files under local folder `path`."""
    if "://" in path:
        raise ValueError(
            f"watched_folder({name!r}): {path!r} is not a local folder; "
            "watchdog sees only local file systems"
        )
    folder = os.path.abspath(os.path.expanduser(path))
    key = asset_key(name, WATCHED_KIND)
    config = WatchedFolderConfig(source=path, path=folder)
    version = compute_version(WATCHED_KIND, config, {})
    spec = dg.AssetSpec(
        key=key,
        description=(description or f"Raw files under `{folder}`, watched for changes.")
        + "\n\nData version: the hash of every file's path and content.",
        metadata={
            "marin/kind": WATCHED_KIND,
            VERSION_TAG: version,
            "path": dg.MetadataValue.path(folder),
        },
        kinds={"folder"},
    )

    def observe(
        context,
    ) -> Any:  # no annotation: Dagster rejects the string one `annotations` makes
        snap = folder_state(folder).snapshot()
        yield dg.ObserveResult(
            asset_key=key,
            data_version=dg.DataVersion(snap.content_hash),
            metadata={"files": snap.files, "bytes": snap.bytes, "hashed": snap.hashed},
        )

    with warnings.catch_warnings():  # observable source assets are "beta" in Dagster 1.13
        warnings.simplefilter("ignore", dg.BetaWarning)
        observe = dg.multi_observable_source_asset(
            specs=[spec], name=f"observe_{key.to_python_identifier()}"
        )(observe)

    # A watched folder is a step with no output of its own: registered so that experiments
    # find it upstream.
    register_step(Step(name, WATCHED_KIND, version, config, {}, observe, observed=True))
    return observe


class FolderCorpusConfig(StepConfig):
    folder: str
    """The watched folder as the experiment wrote it: each document's `source`."""
    path: str = unversioned()
    """The folder resolved at load time (`WatchedFolderConfig.path`)."""
    pattern: str = "*"
    """fnmatch pattern on the path relative to the folder; dotfiles, editor backups (`name~`) and
    interrupted writes are always left out, as the watcher leaves them out."""
    num_shards: int = pydantic.Field(1, ge=1)
    text_key: str = "text"
    """The text field of the records of `.jsonl` files (other files are one document each)."""


def _folder_files(config: FolderCorpusConfig, matching: bool = True) -> list[str]:
    """The files the corpus reads (`matching`), or those its pattern leaves out."""
    import fnmatch

    out = []
    for root, dirs, files in os.walk(config.path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), config.path).replace(os.sep, "/")
            if not ignored(rel) and fnmatch.fnmatch(rel, config.pattern) == matching:
                out.append(rel)
    return sorted(out)


def _not_utf8(path: str, line: int, column: int) -> ValueError:
    return ValueError(
        f"{path}:{line}: byte {column} of the line is not UTF-8; folder_corpus reads UTF-8 "
        "text files: convert it or narrow `pattern`"
    )


def _jsonl_record(path: str, number: int, line: str, config: FolderCorpusConfig) -> str:
    """The text of line `number` of a JSONL file, naming the line when it has none."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise ValueError(
            f"{path}:{number}: not a JSON record ({e}); fix or remove the line"
        ) from None
    value = record.get(config.text_key) if isinstance(record, dict) else None
    if not isinstance(value, str):
        raise ValueError(
            f"{path}:{number}: no string field {config.text_key!r} (fields: "
            f"{sorted(record) if isinstance(record, dict) else type(record).__name__}); "
            "set text_key= on folder_corpus to the field holding the text"
        )
    return value


def _file_documents(
    path: str, rel: str, config: FolderCorpusConfig, digest: Any
) -> Iterator[tuple[str, str]]:
    """`(id, text)` for each document of one file, read line by line for `.jsonl` (a dump of
    gigabytes is never held whole), feeding `digest` the bytes read."""
    with open(path, "rb") as f:
        compressed = compressed_suffix(f.peek(8)[:8])
        if compressed is not None:  # bytes, not text: said so, not as "not UTF-8"
            raise ValueError(
                f"{path} is {compressed[1:]}-compressed; folder_corpus reads plain text files: "
                "put it there decompressed, or leave it out with pattern="
            )
        if not rel.endswith(".jsonl"):
            data = f.read()
            digest.update(data)
            data = data.removeprefix(b"\xef\xbb\xbf")  # an editor's byte order mark is no text
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                line = data.count(b"\n", 0, e.start) + 1
                raise _not_utf8(path, line, e.start - (data.rfind(b"\n", 0, e.start) + 1)) from e
            if text.strip():
                yield rel, text
            return
        for number, raw in enumerate(f, 1):
            digest.update(raw)
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, number, e.start) from e
            if line.strip():
                yield f"{rel}:{number}", _jsonl_record(path, number, line, config)


def _nothing_to_build(config: FolderCorpusConfig) -> str | None:
    # An empty inbox is not built (nor, so, the steps after it): not a failure, and not an
    # empty corpus that fails two steps later. "Materialize all" then builds the rest.
    if not os.path.isdir(config.path):
        return (
            f"the watched folder {config.path} does not exist (or is not a folder); create "
            "it and put text files there, or point watched_folder(...) at it"
        )
    if not _folder_files(config):
        return (
            f"no files under {config.path} match pattern {config.pattern!r} (dotfiles and "
            "temporary files are left out); add files there or change `pattern`"
        )
    return None


def _folder_content(config: FolderCorpusConfig) -> dict[str, str]:
    """The hash of the files the corpus reads. Not in the version, which holds the folder as
    written: recorded with SUCCESS, so a changed folder rebuilds the corpus (and, its data
    version changed, the steps after it) instead of skipping on the old files' output."""
    digests = {}
    for rel in _folder_files(config) if os.path.isdir(config.path) else []:
        try:
            digests[rel] = file_sha256(os.path.join(config.path, rel))
        except FileNotFoundError:  # deleted since it was listed: not part of this build
            continue
    return {"watched folder": content_hash(digests)}


def _run_folder_corpus(
    config: FolderCorpusConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    rels = _folder_files(config)
    digests: dict[str, str] = {}
    documents = text_bytes = 0
    any_text = False
    with contextlib.ExitStack() as stack:
        # Documents go round-robin to the shards as they are read: memory holds one document,
        # not the folder. Each shard appears only when every file was read.
        shards = []
        for index in range(config.num_shards):
            target = fs.join(output_path, f"part-{index:05d}.jsonl.gz")
            out = stack.enter_context(fs.atomic_write(target))
            shards.append(
                stack.enter_context(gzip.GzipFile(filename="", fileobj=out, mode="wb", mtime=0))
            )
        for rel in rels:
            path = os.path.join(config.path, rel)
            digest = hashlib.sha256()
            for doc_id, text in _file_documents(path, rel, config, digest):
                line = json.dumps(
                    {"id": doc_id, "text": text, "source": config.folder}, ensure_ascii=False
                )
                shards[documents % config.num_shards].write((line + "\n").encode("utf-8"))
                documents += 1
                text_bytes += len(text.encode("utf-8"))
                any_text = any_text or (bool(text) and not text.isspace())
            digests[rel] = digest.hexdigest()
        if not any_text:
            raise ValueError(
                f"folder_corpus: the {len(rels)} file(s) under {config.path} hold no text "
                f"({', '.join(rels[:5])}{', ...' if len(rels) > 5 else ''}); add text to them"
            )
    step.log.info(f"{documents} documents from {config.path}")
    left_out = _folder_files(config, matching=False)
    if left_out:
        # A .jsonl.gz dropped beside .jsonl files built nothing, and nothing said so.
        step.log.warning(
            f"{len(left_out)} file(s) under {config.path} do not match pattern "
            f"{config.pattern!r} and were not read: {', '.join(left_out[:10])}"
            f"{', ...' if len(left_out) > 10 else ''}"
        )
    return {
        "left_out_files": dg.MetadataValue.json(left_out[:100]),
        "documents": documents,
        "text_bytes": text_bytes,
        "content_hash": content_hash(digests),
        "folder": dg.MetadataValue.path(config.path),
    }


def folder_corpus(
    name: str,
    source: dg.AssetsDefinition,
    *,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """The text files of watched folder `source` as JSONL shards of `{id, text, source}`."""
    folder_step = step_for(source)
    if folder_step.kind != WATCHED_KIND:
        raise ValueError(
            f"folder_corpus({name!r}): source {folder_step.name} is a {folder_step.kind}, "
            "not a watched_folder"
        )
    cfg = FolderCorpusConfig(
        folder=folder_step.config.source, path=folder_step.config.path, **config
    )
    built = versioned_asset(
        name=name,
        kind="folder_corpus",
        config=cfg,
        run=_run_folder_corpus,
        nothing_to_build=_nothing_to_build,
        source_state=_folder_content,
        description=f"The text files under {cfg.path} as JSONL documents.",
        kinds=("json",),
        resources=resources,
    )
    # The folder has no output for versioned_asset to resolve as an input, so the
    # lineage edge is added here, and the registry learns the upstream step.
    asset = built.map_asset_specs(lambda spec: spec.merge_attributes(deps=[source.key]))
    own = step_for(built)
    register_step(dataclasses.replace(own, upstream={"source": folder_step}, asset=asset))
    return asset
