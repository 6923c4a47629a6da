"""Dataset sources: where a raw dataset comes from, what it holds, and fetching it verified.

A source is one of
  - a local file, folder or glob (`/data/web`, `~/corpus/*.jsonl.zst`, `file:///data/x.csv`);
  - any fsspec URL, file, folder or glob (`gs://bucket/path/*.jsonl.zst`, `s3://...`);
  - an `http(s)://` URL of one file;
  - a Hugging Face dataset id (`owner/name`, or `hf://datasets/owner/name`) with an optional
    revision, subset (the hub's "config"), split and file pattern; `HF_ENDPOINT` selects the hub.

Three steps, each its own function so the asset can call them at the right time:
  `parse_source`  the spec, checked without I/O (unknown format, options that do not apply);
  `resolve`       the files it names, each with size and what identifies its content (an
                  object store's md5/crc32c/generation, an ETag, the hub's LFS sha256 or git
                  blob id, a local file's size and mtime), and for the hub the commit; cheap,
                  because it runs when the code location loads (the content digest is part of
                  the asset's version, so a changed source changes every version downstream);
  `fetch`         the files into an output folder: a file already there at its size is kept,
                  a partial download resumes (Range request, or huggingface_hub's resume), each
                  file is verified against the manifest (size, checksum where one is known) and
                  only then appears under its name.
`check_text_field` reads the first records of every fetched file through Zephyr's readers.

Every error is a `SourceError` naming the source and saying what to do.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import glob as globlib
import hashlib
import http.client
import json
import logging
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from typing import IO, Any

from marin_dagster import fs
from marin_dagster.datasets.digests import cache_dir, file_sha256
from marin_dagster.words import a_type
from marin_dagster.zephyr.readers import (
    Cursor,
    InputError,
    csv_header,
    iter_file_records,
    iter_jsonl,
    open_input,
)

logger = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet", "csv")
# Extensions per format. `.json` counts as JSON lines, as the hub's data files are.
_FORMAT_SUFFIXES = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "parquet": (".parquet",),
    "csv": (".csv", ".tsv"),
}
_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz")
_CHUNK = 8 << 20
PARTIAL_MARK = ".tmp-partial"  # contains fs's temp mark: manifests and listings skip it
SAMPLE_RECORDS = 100
"""Records of each file read to check the text field."""

# Files of a hub repo that describe it rather than hold its data.
_HUB_META = re.compile(
    r"(^|/)(README|LICENSE|LICENCE|CITATION)[^/]*$|\.(md|py|ya?ml)$|"
    r"(^|/)(dataset_infos?|dataset_dict|state)\.json$",
    re.IGNORECASE,
)
# Split names and the words the hub's data-file conventions accept for each.
_SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
_GLOB_CHARS = "*?["


class SourceError(ValueError):
    """A dataset source that cannot be used as given; the message names it and what to do."""

    def __init__(self, source: str, message: str, *, factory: str = ""):
        super().__init__(f"{factory + ': ' if factory else ''}dataset source {source!r}: {message}")
        self.source, self.detail, self.factory = source, message, factory

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in Zephyr workers (the dataset asset fetches there) and sent back to the
        # driver: pickle the fields, not the message.
        return (functools.partial(SourceError, factory=self.factory), (self.source, self.detail))


class SourceUnreachable(SourceError):
    """The source's server did not answer (network down, server stopped), as opposed to an
    answer saying the source is wrong."""


# -- the spec ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """A parsed source: `kind` is "local", "fsspec", "http" or "hub"."""

    kind: str
    location: str
    """An absolute local path or glob, a URL, or a hub repo id."""
    revision: str | None = None
    subset: str | None = None
    split: str | None = None
    files: tuple[str, ...] = ()
    format: str | None = None
    given: str = ""
    """The source as the user wrote it, for messages."""

    def describe(self) -> str:
        parts = [self.given or self.location]
        for key in ("revision", "subset", "split", "format"):
            value = getattr(self, key)
            if value:
                parts.append(f"{key}={value}")
        if self.files:
            parts.append(f"files={list(self.files)}")
        return " ".join(parts)


def _has_glob(path: str) -> bool:
    return any(c in path for c in _GLOB_CHARS)


def parse_source(
    source: str,
    *,
    revision: str | None = None,
    subset: str | None = None,
    split: str | None = None,
    files: str | Sequence[str] | None = None,
    format: str | None = None,
) -> SourceSpec:
    """The spec of `source`, checked without touching the source."""
    if not isinstance(source, str) or not source.strip():
        raise SourceError(str(source), "a source is a non-empty string (path, URL or hub id)")
    given = source
    if format is not None and format not in FORMATS:
        raise SourceError(
            given,
            f"unknown format {format!r}; the formats are {', '.join(FORMATS)} "
            "(compression .gz/.zst/.bz2/.xz comes from the file name)",
        )
    patterns = (files,) if isinstance(files, str) else tuple(files or ())
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise SourceError(given, f"files= takes glob patterns (strings), not {p!r}")
    options = {"revision": revision, "subset": subset, "split": split}

    kind, location = _classify(source.strip())
    if kind != "hub":
        named = [k for k, v in options.items() if v is not None]
        if named:
            raise SourceError(
                given,
                f"{', '.join(named)} apply to Hugging Face datasets only; this source is a "
                f"{'local path' if kind == 'local' else 'URL'}: drop them, or select files "
                "with files=... (glob patterns relative to the folder)",
            )
    if kind == "hub" and "@" in location:
        location, _, inline = location.partition("@")
        if revision is not None and revision != inline:
            raise SourceError(given, f"two revisions given: @{inline} and revision={revision!r}")
        revision = inline
    return SourceSpec(kind, location, revision, subset, split, patterns, format, given)


def _classify(source: str) -> tuple[str, str]:
    if source.startswith("hf://"):
        rest = source[len("hf://") :]
        if not rest.startswith("datasets/") or not _HUB_ID.fullmatch(
            rest[len("datasets/") :].split("@")[0]
        ):
            raise SourceError(
                source, "hub sources are written hf://datasets/owner/name (or just owner/name)"
            )
        return "hub", rest[len("datasets/") :]
    if source.startswith("file://"):
        return "local", fs.normalize(source[len("file://") :])
    if "://" in source:
        scheme = source.split("://", 1)[0].lower()
        if scheme in ("http", "https"):
            return "http", source
        return "fsspec", source.rstrip("/") if not _has_glob(source) else source
    path = fs.normalize(source)
    if os.path.exists(path) or os.path.isabs(os.path.expanduser(source)):
        return "local", path
    if source.startswith((".", "~")) or _has_glob(source):
        return "local", path
    # `src/notes.jsonl` has a hub id's shape; a name that says a data file is a path (hub
    # ids name repositories), and its error is "no such file", not an unreachable hub.
    if _HUB_ID.fullmatch(source.split("@")[0]) and not format_of(source):
        return "hub", source
    return "local", path


# -- the manifest ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SourceFile:
    name: str
    """Its name in the output (relative; its extension says its format)."""
    location: str
    """Where to read it: a local path, a URL, or the path in the hub repo."""
    size: int
    """Bytes; -1 where the server does not say."""
    identity: str
    """What identifies this content: a checksum (a local file's sha256) or an ETag."""
    format: str
    checksum: str | None = None
    """A checksum the fetched bytes must match: `sha256:`, `git-sha1:`, `md5:` (base64),
    `crc32c:` (base64)."""


@dataclasses.dataclass(frozen=True)
class ResolvedSource:
    spec: SourceSpec
    files: tuple[SourceFile, ...]
    revision: str | None = None
    """The hub commit the files were listed at."""
    left_out: tuple[str, ...] = ()
    """Files of a folder or glob whose extension names no format the dataset reads (or not
    the one asked for): not in the version, reported when the dataset is fetched."""

    @property
    def bytes(self) -> int:
        return sum(max(f.size, 0) for f in self.files)

    def content_hash(self) -> str:
        """A digest of the files' names, sizes and identities: it moves when any file changes.

        The hub's commit is not in it: a commit that leaves the selected files as they were
        (a README edit) does not re-download the dataset.
        """
        payload = [[f.name, f.size, f.identity] for f in self.files]
        data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.sha256(data).hexdigest()[:16]

    def manifest(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(f) for f in self.files]

    def origin(self, f: SourceFile) -> str:
        """Where `f` came from, as its owner would open it: a path, a URL, an hf:// URL."""
        if self.spec.kind == "hub":
            at = f"@{self.revision}" if self.revision else ""
            return f"hf://datasets/{self.spec.location}{at}/{f.location}"
        return f.location


def format_of(name: str) -> str | None:
    """The format a file name says (`x.jsonl.zst` -> jsonl), or None."""
    lower = name.lower()
    for suffix in _COMPRESSED:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    for fmt, suffixes in _FORMAT_SUFFIXES.items():
        if lower.endswith(suffixes):
            if fmt == "parquet" and lower != name.lower():
                return None  # a compressed Parquet file is not read as Parquet
            return fmt
    return None


def _output_name(rel: str, fmt: str) -> str:
    """`rel`, with the format's extension added when its own does not say it (data.txt ->
    data.txt.jsonl), so downstream readers, which go by extension, read it right."""
    if format_of(rel) == fmt:
        return rel
    comp = next((s for s in _COMPRESSED if rel.lower().endswith(s)), "")
    base = rel[: len(rel) - len(comp)] if comp else rel
    return f"{base}.{fmt}{comp}"


def _pattern(pattern: str) -> re.Pattern[str]:
    """A glob on relative paths: `*` and `?` stay inside one folder, `**` crosses folders."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out))


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(_pattern(p.lstrip("/")).fullmatch(rel) for p in patterns)


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/")) or fs.is_temp_name(rel)


def _select(
    spec: SourceSpec, candidates: list[tuple[str, Any]], where: str
) -> list[tuple[str, str, Any]]:
    """`(output name, format, item)` for the candidates `(relative name, item)` that are data
    files of the spec's format (and match its `files` patterns)."""
    listed = [(rel, item) for rel, item in candidates if not _hidden(rel)]
    if spec.files:
        matched = [(rel, item) for rel, item in listed if _matches(rel, spec.files)]
        if not matched:
            raise SourceError(
                spec.given,
                f"no file {where} matches files={list(spec.files)}; the files there are "
                f"{_some(rel for rel, _ in listed)}: fix the patterns",
            )
        listed = matched
    if not listed:
        raise SourceError(
            spec.given, f"the source is empty: no files {where}; add data files or fix the path"
        )
    out = []
    for rel, item in listed:
        detected = format_of(rel)
        if spec.format is None and detected is not None:
            out.append((_output_name(rel, detected), detected, item))
        elif spec.format is not None and detected in (spec.format, None):
            out.append((_output_name(rel, spec.format), spec.format, item))
    if not out:
        raise SourceError(
            spec.given,
            f"unknown format: none of the files {where} ({_some(rel for rel, _ in listed)}) "
            f"is {'a ' + spec.format + ' file' if spec.format else 'JSON lines, Parquet or CSV by its extension'} "
            "(.jsonl/.json/.ndjson, .parquet, .csv, optionally .gz/.zst); pass format='jsonl', "
            "'parquet' or 'csv' to read files whose extension does not say, and files=... to "
            "pick them",
        )
    return out


def _left_out(
    spec: SourceSpec, candidates: list[tuple[str, Any]], selected: list[tuple[str, str, Any]]
) -> tuple[str, ...]:
    """The candidates `_select` passed over for their format (hidden and unmatched ones are
    the user's choice)."""
    chosen = {item for _, _, item in selected}  # paths: local, or the filesystem's
    return tuple(
        sorted(
            rel
            for rel, item in candidates
            if item not in chosen
            and not _hidden(rel)
            and (not spec.files or _matches(rel, spec.files))
        )
    )


def _some(names: Iterable[str], n: int = 8) -> str:
    names = sorted(names)
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "") if names else "none"


def _remembered_path(spec: SourceSpec) -> str:
    fields = dataclasses.asdict(spec)
    if spec.kind == "hub":
        fields["endpoint"] = hub_endpoint()  # one id, two hubs: two sources
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return os.path.join(cache_dir(), "sources", f"{key}.json")


def _remember(resolved: ResolvedSource) -> None:
    """Keep the manifest of a remote source, for when its server does not answer."""
    record = {"resolved_at": time.time(), **dataclasses.asdict(resolved)}
    path = _remembered_path(resolved.spec)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: only the offline fallback is lost


def _remembered(spec: SourceSpec) -> tuple[ResolvedSource, float] | None:
    try:
        with open(_remembered_path(spec)) as f:
            record = json.load(f)
        files = tuple(SourceFile(**f) for f in record["files"])
        return ResolvedSource(spec, files, record["revision"]), record["resolved_at"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve(spec: SourceSpec) -> ResolvedSource:
    """The files `spec` names, with sizes and identities (and for the hub the commit).

    A remote source whose server does not answer is taken as last resolved on this machine
    (with a warning), so an experiment loads offline: its status shows, and the steps
    after a dataset already fetched run. Fetching it still needs the server.
    """
    try:
        if spec.kind == "local":
            resolved = _resolve_local(spec)
        elif spec.kind == "fsspec":
            resolved = _resolve_fsspec(spec)
        elif spec.kind == "http":
            resolved = _resolve_http(spec)
        elif spec.kind == "hub":
            resolved = _resolve_hub(spec)
        else:
            raise SourceError(spec.given, f"unknown source kind {spec.kind!r}")
    except SourceUnreachable as e:
        last = _remembered(spec)
        if last is None:
            raise
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last[1]))
        logger.warning(
            f"{e}; using the source's files as resolved at {when} on this machine (the "
            "versions stay theirs): fetching it still needs the server"
        )
        return last[0]
    if spec.kind != "local":
        _remember(resolved)
    if resolved.bytes == 0 and all(f.size == 0 for f in resolved.files):
        raise SourceError(
            spec.given,
            f"the source is empty: its {len(resolved.files)} file(s) hold 0 bytes "
            f"({_some(f.name for f in resolved.files)}); add data or point at another source",
        )
    return resolved


def _resolve_local(spec: SourceSpec) -> ResolvedSource:
    path = spec.location
    if _has_glob(path):
        base = _glob_base(path)
        paths = [p for p in globlib.glob(path, recursive=True) if os.path.isfile(p)]
        where = f"match {path}"
    elif os.path.isdir(path):
        base = path
        paths = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            paths.extend(os.path.join(root, n) for n in names)
        where = f"under {path}"
    elif os.path.isfile(path):
        base, paths, where = os.path.dirname(path), [path], f"at {path}"
    else:
        hint = ""
        if _HUB_ID.fullmatch(spec.given) and not format_of(spec.given):
            hint = " (a hub dataset id is written owner/name; this one was not found locally)"
        raise SourceError(
            spec.given,
            f"no such file or folder: {path}{hint}; check the path (relative paths are "
            f"relative to {os.getcwd()})",
        )
    candidates = [(os.path.relpath(p, base).replace(os.sep, "/"), p) for p in paths]
    files = []
    selected = _select(spec, candidates, where)
    for name, fmt, p in selected:
        # By content, not mtime: a copied or touched file keeps its version (digests.py
        # caches the hash, as every process that loads the code location resolves this).
        checksum = f"sha256:{file_sha256(p)}"
        files.append(SourceFile(name, p, os.path.getsize(p), checksum, fmt, checksum))
    return ResolvedSource(
        spec,
        tuple(sorted(files, key=lambda f: f.name)),
        left_out=_left_out(spec, candidates, selected),
    )


def _glob_base(path: str) -> str:
    parts = path.split("/")
    fixed = []
    for part in parts:
        if _has_glob(part):
            break
        fixed.append(part)
    return "/".join(fixed) or "/"


def _object_identity(info: dict[str, Any]) -> tuple[str, str | None]:
    """(identity, checksum) of an object from its fsspec info: content checksums first."""
    if info.get("md5Hash"):
        return f"md5:{info['md5Hash']}", f"md5:{info['md5Hash']}"
    if info.get("crc32c"):
        ident = f"crc32c:{info['crc32c']}"
        return (ident + f":generation={info['generation']}" if info.get("generation") else ident), (
            f"crc32c:{info['crc32c']}"
        )
    for key in ("generation", "ETag", "etag", "LastModified", "mtime", "updated", "created"):
        if info.get(key):
            return f"{key}={info[key]}", None
    return "", None


def _resolve_fsspec(spec: SourceSpec) -> ResolvedSource:
    url = spec.location
    protocol = url.split("://", 1)[0] + "://"
    try:
        fsys, root = fs.url_to_fs(url)
        if _has_glob(url):
            base = _glob_base(root)
            infos = {p: i for p, i in fsys.glob(root, detail=True).items() if i["type"] == "file"}
            where = f"match {url}"
        elif fsys.isdir(root):
            base = root.rstrip("/")
            infos = fsys.find(root, detail=True)
            where = f"under {url}"
        elif fsys.exists(root):
            base = root.rsplit("/", 1)[0]
            infos = {root: fsys.info(root)}
            where = f"at {url}"
        else:
            raise SourceError(
                spec.given, f"not found: {url} does not exist; check the bucket and the path"
            )
    except SourceError:
        raise
    except (FileNotFoundError, PermissionError, OSError) as e:
        kind = (
            SourceError if isinstance(e, FileNotFoundError | PermissionError) else SourceUnreachable
        )
        raise kind(
            spec.given, f"cannot list {url} ({type(e).__name__}: {e}); check the URL and access"
        ) from e
    candidates = [(p[len(base) + 1 :] if p.startswith(base + "/") else p, p) for p in infos]
    files = []
    selected = _select(spec, candidates, where)
    for name, fmt, p in selected:
        info = infos[p]
        identity, checksum = _object_identity(info)
        full = p if p.startswith(protocol) else protocol + p
        files.append(SourceFile(name, full, int(info.get("size") or 0), identity, fmt, checksum))
    return ResolvedSource(
        spec,
        tuple(sorted(files, key=lambda f: f.name)),
        left_out=_left_out(spec, candidates, selected),
    )


_HTTP_TIMEOUT = 60


def _http_error(spec: SourceSpec, url: str, e: Exception) -> SourceError:
    if isinstance(e, urllib.error.HTTPError):
        what = {404: "not found", 403: "access denied", 401: "needs credentials"}.get(e.code, "")
        return SourceError(
            spec.given,
            f"HTTP {e.code} {e.reason}{' (' + what + ')' if what else ''} for {url}; check the "
            "URL (and that the file is public)",
        )
    return SourceUnreachable(
        spec.given, f"cannot reach {url} ({type(e).__name__}: {e}); check the URL"
    )


def _resolve_http(spec: SourceSpec) -> ResolvedSource:
    url = spec.location
    headers: Any
    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT) as response:
            headers = response.headers
    except urllib.error.HTTPError as e:
        if e.code not in (405, 501):
            raise _http_error(spec, url, e) from None
        try:  # a server without HEAD: the headers of a GET, body unread
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT) as response:
                headers = response.headers
        except (urllib.error.URLError, OSError) as e2:
            raise _http_error(spec, url, e2) from None
    except (urllib.error.URLError, OSError) as e:
        raise _http_error(spec, url, e) from None
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    rel = path.rstrip("/").rsplit("/", 1)[-1]
    if not rel:
        raise SourceError(spec.given, "the URL names no file; give the URL of a data file")
    size = int(headers.get("Content-Length", -1))
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    if etag:
        identity = f"etag={etag}"
    elif modified:
        identity = f"last-modified={modified}"
    else:
        logger.warning(
            f"{url}: the server gives no ETag or Last-Modified; a change of the same size "
            "would go unnoticed"
        )
        identity = ""
    md5 = headers.get("Content-MD5")
    selected = _select(spec, [(rel, url)], f"at {url}")
    name, fmt, _ = selected[0]
    return ResolvedSource(
        spec, (SourceFile(name, url, size, identity, fmt, f"md5:{md5}" if md5 else None),)
    )


def hub_endpoint() -> str:
    """The hub `HF_ENDPOINT` names now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _hub_error(spec: SourceSpec, e: Exception) -> SourceError:
    from huggingface_hub import errors

    repo = spec.location
    if isinstance(e, errors.RevisionNotFoundError):
        return SourceError(
            spec.given,
            f"revision {spec.revision!r} does not exist in the hub dataset {repo}; use a "
            "branch, tag or commit sha listed on its 'Files and versions' page",
        )
    if isinstance(e, errors.GatedRepoError):
        return SourceError(
            spec.given,
            f"the hub dataset {repo} is gated; accept its terms on the hub and set HF_TOKEN",
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        local = fs.normalize(spec.given)
        return SourceError(
            spec.given,
            f"no dataset {repo!r} on the hub at {hub_endpoint()} (or it is private: set "
            f"HF_TOKEN), and no local file or folder {local}; check the id (owner/name) or "
            "the path",
        )
    if isinstance(e, errors.RemoteEntryNotFoundError):
        return SourceError(
            spec.given, f"a file of {repo} is gone from the hub ({e}); rerun to resolve again"
        )
    if isinstance(e, errors.OfflineModeIsEnabled):
        return SourceError(
            spec.given, "HF_HUB_OFFLINE is set, so the hub cannot be asked; unset it"
        )
    if isinstance(e, errors.HfHubHTTPError):
        return SourceError(spec.given, f"the hub answered with an error: {e}".strip())
    return SourceUnreachable(
        spec.given,
        f"the hub at {hub_endpoint()} is unreachable ({type(e).__name__}: {e}); check the "
        "network or HF_ENDPOINT",
    )


def _hub_call(spec: SourceSpec, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from huggingface_hub import errors

    try:
        return fn(*args, **kwargs)
    except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled) as e:
        raise _hub_error(spec, e) from None
    except OSError as e:  # connection errors (httpx's are OSErrors) and timeouts
        raise _hub_error(spec, e) from None
    except Exception as e:
        if type(e).__module__.startswith(("httpx", "httpcore")):
            raise _hub_error(spec, e) from None
        raise


def _resolve_hub(spec: SourceSpec) -> ResolvedSource:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint())
    info = _hub_call(
        spec, api.dataset_info, spec.location, revision=spec.revision, files_metadata=True
    )
    siblings = {s.rfilename: s for s in info.siblings or []}
    candidates = [(rel, s) for rel, s in siblings.items() if not _HUB_META.search(rel)]
    where = f"in the hub dataset {spec.location} at {info.sha[:12] if info.sha else '?'}"
    card = info.card_data.to_dict() if info.card_data is not None else {}
    candidates = _hub_subset_split(spec, candidates, card.get("configs"), where)
    files = []
    for name, fmt, s in _select(spec, candidates, where):
        if s.lfs is not None:
            size, checksum = s.lfs.size, f"sha256:{s.lfs.sha256}"
        else:
            size, checksum = (
                (s.size if s.size is not None else -1),
                (f"git-sha1:{s.blob_id}" if s.blob_id else None),
            )
        files.append(SourceFile(name, s.rfilename, size, checksum or "", fmt, checksum))
    return ResolvedSource(spec, tuple(sorted(files, key=lambda f: f.name)), revision=info.sha)


def _config_splits(data_files: Any) -> dict[str, list[str]]:
    """A hub card config's data_files as {split: patterns}; files without a split are train."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {k: [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    out: dict[str, list[str]] = {}
    for entry in data_files or []:
        if isinstance(entry, str):
            out.setdefault("train", []).append(entry)
        elif isinstance(entry, dict):
            paths = entry.get("path", [])
            out.setdefault(entry.get("split", "train"), []).extend(
                [paths] if isinstance(paths, str) else paths
            )
    return out


def _split_of(rel: str, split: str) -> bool:
    words = _SPLIT_WORDS.get(split, (split,))
    parts = rel.lower().split("/")
    if any(p in words for p in parts[:-1]):
        return True
    stem = parts[-1]
    return any(re.search(rf"(^|[-_.]){re.escape(w)}([-_.]|$)", stem) for w in words)


def _hub_subset_split(
    spec: SourceSpec, candidates: list[tuple[str, Any]], configs: Any, where: str
) -> list[tuple[str, Any]]:
    """The candidates of the spec's subset and split: from the dataset card's `configs`
    where it declares them, else by the hub's folder and file-name conventions."""
    if spec.files and spec.subset is None and spec.split is None:
        return candidates  # files= alone picks from the whole repo, as data_files= does
    if configs:
        by_name = {c.get("config_name", "default"): c for c in configs if isinstance(c, dict)}
        name = spec.subset
        if name is None:
            defaults = [n for n, c in by_name.items() if c.get("default")]
            name = (
                defaults[0]
                if defaults
                else "default"
                if "default" in by_name
                else next(iter(by_name))
                if len(by_name) == 1
                else None
            )
            if name is None:
                raise SourceError(
                    spec.given,
                    f"the dataset has several subsets ({_some(by_name)}) and none is the "
                    "default; pass subset=... naming one",
                )
        if name not in by_name:
            raise SourceError(
                spec.given,
                f"no subset {name!r} {where}; its subsets are {_some(by_name)}: pass one of "
                "them as subset=...",
            )
        splits = _config_splits(by_name[name].get("data_files"))
        if spec.split is not None:
            if spec.split not in splits:
                raise SourceError(
                    spec.given,
                    f"no split {spec.split!r} in subset {name!r} {where}; its splits are "
                    f"{_some(splits)}",
                )
            patterns = splits[spec.split]
        else:
            patterns = [p for ps in splits.values() for p in ps]
        return [(rel, s) for rel, s in candidates if _matches(rel, patterns)]
    if spec.subset is not None:
        chosen = [(rel, s) for rel, s in candidates if rel.startswith(spec.subset + "/")]
        if not chosen:
            folders = {rel.split("/")[0] for rel, _ in candidates if "/" in rel}
            raise SourceError(
                spec.given,
                f"no subset {spec.subset!r} {where}: the card declares no configs and no "
                f"folder is named so (folders: {_some(folders)}); drop subset= or use files=",
            )
        candidates = chosen
    if spec.split is not None:
        chosen = [(rel, s) for rel, s in candidates if _split_of(rel, spec.split)]
        if not chosen:
            raise SourceError(
                spec.given,
                f"no file of split {spec.split!r} {where} (split names come from folder and "
                f"file names; files: {_some(rel for rel, _ in candidates)}); check the split "
                "or pick files with files=...",
            )
        candidates = chosen
    return candidates


# -- fetching ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FetchResult:
    files: list[str]
    """The fetched files' full paths in the output, in manifest order."""
    downloaded: list[str]
    kept: list[str]
    """Names already complete in the output (a rerun after a killed run)."""
    resumed: list[str]
    """Names whose download continued a partial one."""
    sha256: dict[str, str]
    """sha256 of each file downloaded by this call."""


def _staging_dir(output_path: str, staging: str | None) -> str:
    if fs.is_local(output_path):
        return fs.normalize(output_path)  # partials sit beside their targets: one rename
    if staging:
        return fs.normalize(staging)
    key = hashlib.sha256(output_path.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "marin-dataset-staging", key)


@dataclasses.dataclass(frozen=True)
class FileFetch:
    """What `fetch_file` did with one file."""

    name: str
    path: str
    status: str  # "downloaded", "resumed" (a partial download continued) or "kept"
    sha256: str | None = None  # of a file this call downloaded
    resumed_at: int = 0  # the byte a resumed download continued from


def fetch_file(
    resolved: ResolvedSource, f: SourceFile, output_path: str, *, staging: str | None = None
) -> FileFetch:
    """One file of `resolved` into `output_path`, verified, under its name only once complete.

    Independent of the other files, so a pipeline can fetch them in parallel (the `dataset`
    asset runs one Zephyr task per file); `fetch` is the sequential loop.
    """
    stage = _staging_dir(output_path, staging)
    target = fs.join(output_path, f.name)
    if fs.exists(target):
        fsys, p = fs.url_to_fs(target)
        # A file appears under its name only after verification, so one of the right
        # size is a finished download of a killed run, not a partial one.
        if f.size < 0 or fsys.size(p) == f.size:
            return FileFetch(f.name, target, "kept")
        fs.remove(target)
    partial = os.path.join(stage, f.name + PARTIAL_MARK)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    if f.size >= 0 and offset > f.size:
        os.remove(partial)
        offset = 0
    if offset:
        logger.info("%s: resuming the download at byte %s of %s", f.name, offset, f.size)
    _download(resolved, f, partial)
    digest = _verify(resolved, f, partial)
    if fs.is_local(output_path):
        os.replace(partial, fs.url_to_fs(target)[1])
    else:
        fsys, p = fs.url_to_fs(target)
        fsys.put_file(partial, p)  # an object appears whole once its upload completes
        os.remove(partial)
    return FileFetch(f.name, target, "resumed" if offset else "downloaded", digest, offset)


def fetch_summary(
    resolved: ResolvedSource, fetched: Sequence[FileFetch], log: logging.Logger | Any = logger
) -> FetchResult:
    """The FetchResult of `fetched` (one FileFetch per file of `resolved`, in its order)."""
    for r in fetched:
        if r.status == "resumed":
            log.info(f"{r.name}: the download resumed at byte {r.resumed_at:,}")
    new = [r.name for r in fetched if r.status != "kept"]
    kept = [r.name for r in fetched if r.status == "kept"]
    resumed = [r.name for r in fetched if r.status == "resumed"]
    log.info(
        f"{resolved.spec.describe()}: {len(new)} file(s) downloaded, {len(kept)} already "
        f"there ({len(resumed)} resumed)"
    )
    return FetchResult(
        [r.path for r in fetched],
        new,
        kept,
        resumed,
        {r.name: r.sha256 for r in fetched if r.sha256},
    )


def fetch(
    resolved: ResolvedSource,
    output_path: str,
    *,
    staging: str | None = None,
    log: logging.Logger | Any = logger,
) -> FetchResult:
    """Every file of `resolved` into `output_path`, verified, each under its name only once
    complete; a rerun keeps finished files and resumes partial ones.

    Partial downloads live in `staging` (a local folder; for a local output, the output
    folder itself) as `<name>.tmp-partial`.
    """
    fetched = [fetch_file(resolved, f, output_path, staging=staging) for f in resolved.files]
    return fetch_summary(resolved, fetched, log)


def _download(resolved: ResolvedSource, f: SourceFile, partial: str) -> None:
    spec = resolved.spec
    if spec.kind == "hub":
        _download_hub(resolved, f, partial)
        return
    if spec.kind == "http":
        _download_http(spec, f, partial)
        return
    try:
        fsys, p = fs.url_to_fs(f.location)
        with open(partial, "ab") as out, fsys.open(p, "rb") as src:
            offset = out.tell()
            if offset:
                src.seek(offset)
            _copy(src, out)
    except FileNotFoundError:
        raise SourceError(
            spec.given, f"{f.location} is gone since the source was resolved; reload and rerun"
        ) from None
    except OSError as e:  # a read from the store failed midway: what arrived is kept
        raise _broke_off(spec, f, partial, e) from None


def _copy(src: IO[bytes], out: IO[bytes]) -> None:
    while chunk := src.read(_CHUNK):
        out.write(chunk)
    out.flush()
    os.fsync(out.fileno())


def _download_http(spec: SourceSpec, f: SourceFile, partial: str) -> None:
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    if f.size >= 0 and offset == f.size:
        return
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if f.identity.startswith("etag="):
            headers["If-Range"] = f.identity[len("etag=") :]  # a changed file comes back whole
    request = urllib.request.Request(f.location, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT) as response:
            mode = "ab" if offset and response.status == 206 else "wb"
            with open(partial, mode) as out:
                # read1 hands over what has arrived, so a connection that breaks keeps
                # every byte received for the resumed download
                while chunk := response.read1(_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
    except urllib.error.HTTPError as e:
        raise _http_error(spec, f.location, e) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise _broke_off(spec, f, partial, e) from None
    got = os.path.getsize(partial)
    if f.size >= 0 and got < f.size:
        raise _broke_off(spec, f, partial, EOFError(f"{got:,} of {f.size:,} bytes"))


def _broke_off(
    spec: SourceSpec, f: SourceFile, partial: str, e: BaseException
) -> SourceError | OSError:
    got = os.path.getsize(partial) if os.path.exists(partial) else 0
    if isinstance(e, OSError) and e.errno in fs.WRITE_ERRNOS:
        # The copy could not be written (a full disk): the source is fine, and a rerun
        # resumes only once there is room, so the error names the copy, not the source.
        if e.filename is None:
            e.filename = partial
        e.add_note(
            f"while fetching {f.location} (dataset source {spec.given!r}): the {got:,} bytes "
            "received are kept; make room there, or set MARIN_PREFIX to a disk that has it, "
            "and rerun to resume"
        )
        return e
    return SourceError(
        spec.given,
        f"the download of {f.location} broke off after {got:,} bytes ({type(e).__name__}: "
        f"{e}); rerun to resume it from there",
    )


def _download_hub(resolved: ResolvedSource, f: SourceFile, partial: str) -> None:
    from huggingface_hub import errors, hf_hub_url
    from huggingface_hub.file_download import get_hf_file_metadata, http_get
    from huggingface_hub.utils import build_hf_headers

    spec, endpoint = resolved.spec, hub_endpoint()
    url = hf_hub_url(
        spec.location,
        f.location,
        repo_type="dataset",
        revision=resolved.revision or spec.revision,
        endpoint=endpoint,
    )
    meta = _hub_call(spec, get_hf_file_metadata, url, endpoint=endpoint)
    headers = build_hf_headers()
    if _origin(meta.location) != _origin(endpoint):
        headers.pop("authorization", None)  # a CDN's signed URL: the token stays on the hub
    with open(partial, "ab") as out:
        offset = out.tell()
        if f.size >= 0 and offset == f.size:
            return
        # huggingface_hub's download, resumed with a Range request from `offset`; a server
        # that ignores the range sends the whole file and http_get starts the file over.
        try:
            http_get(
                meta.location,
                out,
                resume_size=offset,
                headers=headers,
                expected_size=f.size if f.size >= 0 else None,
                displayed_filename=f.name,
            )
        except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled) as e:
            raise _hub_error(spec, e) from None
        except Exception as e:  # connection lost past http_get's retries, size mismatch
            if isinstance(e, OSError) or type(e).__module__.startswith(("httpx", "httpcore")):
                out.flush()
                raise _broke_off(spec, f, partial, e) from None
            raise
        out.flush()
        os.fsync(out.fileno())


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _verify(resolved: ResolvedSource, f: SourceFile, partial: str) -> str:
    """sha256 of the download; a size or checksum that differs from the manifest raises (and
    the partial file is dropped, so the rerun fetches it again)."""
    spec = resolved.spec
    size = os.path.getsize(partial)
    sha256 = hashlib.sha256()
    kind, _, expected = (f.checksum or "").partition(":")
    other: Any = None
    if kind == "git-sha1":
        other = hashlib.sha1(f"blob {size}\0".encode())
    elif kind == "md5":
        other = hashlib.md5()
    elif kind == "crc32c":
        try:
            import google_crc32c

            other = google_crc32c.Checksum()
        except ImportError:  # gcsfs brings it; without it the size is the check
            kind = ""
    with open(partial, "rb") as src:
        while chunk := src.read(_CHUNK):
            sha256.update(chunk)
            if other is not None:
                other.update(chunk)
    got = {
        "sha256": sha256.hexdigest(),
        "git-sha1": other.hexdigest() if kind == "git-sha1" else None,
        "md5": base64.b64encode(other.digest()).decode() if kind == "md5" else None,
        "crc32c": base64.b64encode(other.digest()).decode() if kind == "crc32c" else None,
    }.get(kind)
    problem = None
    if f.size >= 0 and size != f.size:
        problem = f"{size:,} bytes arrived, the source lists {f.size:,}"
    elif kind and got != expected:
        problem = f"its {kind} is {got}, the source lists {expected}"
    if problem:
        os.remove(partial)
        raise SourceError(
            spec.given,
            f"{f.name} failed verification ({problem}); the partial copy was dropped: rerun "
            "to fetch it again (if it keeps failing, the source changed: reload the code "
            "location so the asset gets the new version)",
        )
    return sha256.hexdigest()


# -- records -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SampleCheck:
    """What `check_text_field` read: records with a text field, and the broken JSON lines
    it stepped over (each an error naming the file and line)."""

    records: int
    broken: list[str]


def check_text_field(
    paths: Sequence[str],
    text_key: str,
    *,
    source: str,
    sample: int = SAMPLE_RECORDS,
    allow_empty: bool = False,
) -> SampleCheck:
    """Read the first `sample` records of every file: each must be an object whose `text_key`
    is a string. A source with no records raises unless `allow_empty` (a caller checking one
    file at a time adds the counts up itself).

    A broken JSON line among them is reported, not raised: the dataset is a copy, and the
    step reading it decides (the tokenizer's `skip_bad_records`). A file whose sample is
    more broken lines than good is not JSON lines at all, and raises.
    """
    read = 0
    broken: list[str] = []
    for path in paths:
        fmt = format_of(path) or "jsonl"
        cursor = Cursor()
        bad: list[InputError] = []
        good = 0
        try:
            records = (
                iter_jsonl(path, cursor, bad=bad)
                if fmt == "jsonl"
                else iter_file_records(path, fmt, cursor=cursor, csv_as_text=True)
            )
            for i, record in enumerate(records):
                if i + len(bad) >= sample:
                    break
                good += 1
                where = cursor.describe() if fmt == "jsonl" else f"record {i} of {path}"
                if not isinstance(record, dict):
                    raise SourceError(
                        source,
                        f"{where} is {a_type(record)}, not an object with fields; "
                        "each record must be an object with a text field",
                    )
                # Records before this one had the field: this record is the one to fix, and
                # another text_key would break them.
                fix = (
                    "give that record its text or remove it"
                    if read + good > 1
                    else "pass text_key=<the field holding the text>"
                )
                if text_key not in record:
                    raise SourceError(
                        source,
                        f"{where} has no field {text_key!r}; its fields are {sorted(record)}: "
                        + fix,
                    )
                if record[text_key] is None:
                    raise SourceError(
                        source,
                        f"{where}: field {text_key!r} is null: give that record its text or "
                        "remove it",
                    )
                if not isinstance(record[text_key], str):
                    value = record[text_key]
                    raise SourceError(
                        source,
                        f"{where}: field {text_key!r} holds the {type(value).__name__} "
                        f"{str(value)[:40]!r}, not a string: {fix}",
                    )
            if len(bad) > good:
                raise bad[0]
            if fmt == "csv" and good == 0:
                header = csv_header(path)
                if header and text_key not in header:
                    # A file of one line: the line became the header, and no record was read.
                    raise SourceError(
                        source,
                        f"{path}: its first line, {','.join(header)[:80]!r}, is read as the "
                        f"names of its columns and names no {text_key!r}, and no record "
                        "follows it: a CSV starts with a line naming its columns; add one, or "
                        "pass text_key=<the column holding the text>",
                    )
        except InputError as e:
            raise SourceError(
                source, f"{e} (if the file is in another format, pass format=...)"
            ) from None
        read += good
        broken.extend(str(e) for e in bad)
    if read == 0 and not allow_empty:
        raise SourceError(
            source,
            f"the source is empty: its {len(paths)} file(s) hold no records; add data or "
            "point at another source",
        )
    return SampleCheck(read, broken)


def count_records(path: str) -> int:
    """Records in one file: Parquet from its footer, JSON lines by their non-blank lines,
    CSV by its rows."""
    fmt = format_of(path) or "jsonl"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        fsys, p = fs.url_to_fs(path)
        with fsys.open(p, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows
    if fmt == "jsonl":
        n = 0
        with open_input(path) as f:
            for line in f:
                if line.strip():
                    n += 1
        return n
    from marin_dagster.zephyr.readers import iter_csv_batches

    return sum(b.num_rows for b in iter_csv_batches(path))


def preview(paths: Sequence[str], text_key: str, n: int = 5, chars: int = 100) -> list[dict]:
    """The first `n` records (file name, the text's opening and length)."""
    rows: list[dict] = []
    for path in paths:
        fmt = format_of(path) or "jsonl"
        # broken lines were reported by the check; the preview shows the records around them
        records = (
            iter_jsonl(path, bad=[])
            if fmt == "jsonl"
            else iter_file_records(path, fmt, csv_as_text=True)
        )
        for record in records:
            text = record.get(text_key, "") if isinstance(record, dict) else ""
            rows.append(
                {
                    "file": fs.basename(path),
                    "chars": len(text),
                    "opening": " ".join(str(text).split())[:chars],
                }
            )
            if len(rows) >= n:
                return rows
            if len(rows) >= 2 and len(paths) > 1:
                break  # a few from each file rather than all from the first
    return rows
