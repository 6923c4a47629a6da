"""Build a token cache from text shards: one cache shard per input shard.

Each input shard is one task. A task reads its file, tokenizes the documents
in record order with ``encode_batch``, and writes ``train/part-NNNNN`` (and,
when a validation fraction is held out, ``validation/part-NNNNN``) with the
same index as the input file. Because a shard's bytes depend only on its input
file, the tokenizer and the options, the cache is byte-identical whatever the
worker count or scheduling order.

Resume: a task whose shards all have ``.success`` is not redone. The ledgers
and ``.stats.json`` are written after every task is done.

``sample_count``: the first N documents of the source in input-file order,
then record order (empty and bad records do not count). The builder counts
documents per file up front (reading only as many files as it needs), so each
task knows its own limit and the result does not depend on the workers. The
validation fraction is held out from those N; separate validation files are
not limited.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from marin_dagster import fs
from marin_dagster.tokenize.cache import (
    SUCCESS_NAME,
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_split,
    shard_name,
    write_cache_stats,
)
from marin_dagster.tokenize.records import (
    BadRecordError,
    Document,
    RecordCounts,
    held_out,
    iter_documents,
    read_records,
)
from marin_dagster.tokenize.tokenizer import find_eos_id, load_tokenizer, vocab_size
from marin_dagster.zephyr import Dataset, InputError, ShardFailedError, ZephyrContext

logger = logging.getLogger(__name__)

TRAIN = "train"
VALIDATION = "validation"
# Documents per encode_batch call, and a cap on their total text size, so a
# batch keeps the tokenizer's threads busy without holding much text.
_BATCH_DOCS = 1024
_BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class TokenizeOptions:
    """How records become cache documents (everything that changes the cache's bytes)."""

    text_key: str = "text"
    id_key: str | None = "id"
    append_eos: bool = True
    validation_fraction: float = 0.0
    skip_bad_records: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )


@dataclass(frozen=True)
class ShardTask:
    """One input shard to tokenize into cache shard ``shard_index`` of ``split``."""

    source: str
    shard_index: int
    split: str  # TRAIN (with the held-out fraction going to VALIDATION) or VALIDATION
    limit: int | None = None  # at most this many documents (sample_count)


@dataclass
class ShardResult:
    task: ShardTask
    processed: bool  # False when the shard was already finished (resume)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    num_records: int = 0
    num_empty: int = 0
    num_bad: int = 0


@dataclass
class TokenCacheStats:
    """What a build produced; ``splits`` mirrors ``.stats.json``."""

    output_path: str
    splits: dict[str, dict[str, int]]
    dtype: str
    eos_id: int | None  # the id appended after each document (None: append_eos=False)
    vocab_size: int
    shards_total: int
    shards_processed: int
    shards_skipped: int
    num_records: int
    num_empty: int
    num_bad: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def num_tokens(self) -> int:
        return sum(s["num_tokens"] for s in self.splits.values())

    @property
    def num_docs(self) -> int:
        return sum(s["num_docs"] for s in self.splits.values())

    @property
    def num_bytes(self) -> int:
        return sum(s["num_bytes"] for s in self.splits.values())


# --- per-shard work (runs in workers) ------------------------------------------

_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer_from_json(tokenizer_json: str) -> Tokenizer:
    # Workers get the tokenizer as JSON text (no shared filesystem needed) and
    # build it once per process.
    key = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
    tok = _TOKENIZERS.get(key)
    if tok is None:
        tok = _TOKENIZERS[key] = Tokenizer.from_str(tokenizer_json)
    return tok


def _shard_dirs(output_path: str, task: ShardTask, options: TokenizeOptions) -> dict[str, str]:
    name = shard_name(task.shard_index)
    if task.split == VALIDATION:
        return {VALIDATION: fs.join(output_path, VALIDATION, name)}
    dirs = {TRAIN: fs.join(output_path, TRAIN, name)}
    if options.validation_fraction > 0:
        dirs[VALIDATION] = fs.join(output_path, VALIDATION, name)
    return dirs


def _batches(docs: Iterable[Document]) -> Iterable[list[Document]]:
    batch: list[Document] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += doc.num_bytes
        if len(batch) >= _BATCH_DOCS or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def tokenize_shard(
    records: Iterable[tuple[int, Any]],
    source: str,
    shard_index: int,
    output_path: str,
    tokenizer: Tokenizer,
    options: TokenizeOptions,
    *,
    dtype: Any,
    eos_id: int | None,
    split: str = TRAIN,
    limit: int | None = None,
) -> ShardResult:
    """Tokenize ``(record_index, record)`` pairs of one input shard into its cache shard(s).

    Pure in its inputs: the shard's bytes depend only on the records, the
    tokenizer, the options, dtype and eos_id.
    """
    task = ShardTask(source, shard_index, split, limit)
    dirs = _shard_dirs(output_path, task, options)
    if options.append_eos and eos_id is None:
        raise ValueError("append_eos=True needs an eos_id")
    eos = None if not options.append_eos else np.array([eos_id], dtype=np.dtype(dtype))
    writers = {s: TokenCacheShardWriter(d, dtype=dtype) for s, d in dirs.items()}
    counts = RecordCounts()
    docs = iter_documents(
        records,
        source,
        options.text_key,
        options.id_key,
        skip_bad_records=options.skip_bad_records,
        counts=counts,
        limit=limit,
    )
    holdout = VALIDATION in writers and split == TRAIN
    for batch in _batches(docs):
        encodings = tokenizer.encode_batch_fast([d.text for d in batch], add_special_tokens=False)
        for doc, enc in zip(batch, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if eos is not None:
                ids = np.concatenate([ids, eos])
            target = (
                VALIDATION
                if holdout and held_out(doc.doc_id, options.validation_fraction)
                else split
            )
            writers[target].add(ids, num_bytes=doc.num_bytes)
    result = ShardResult(
        task, processed=True, num_records=counts.records, num_empty=counts.empty, num_bad=counts.bad
    )
    # The first split's marker carries the record counts; writing the primary
    # split last means its .success marks the whole task as done.
    order = [s for s in writers if s != split] + [split]
    for s in order:
        extra = (
            {"num_records": counts.records, "num_empty": counts.empty, "num_bad": counts.bad}
            if s == split
            else None
        )
        stats = writers[s].finish(extra)
        result.splits[s] = {
            "num_tokens": stats["num_tokens"],
            "num_docs": stats["num_docs"],
            "num_bytes": stats["bytes"],
        }
    return result


def _finished_result(task: ShardTask, dirs: dict[str, str]) -> ShardResult | None:
    markers = {s: fs.read_json_or_none(fs.join(d, SUCCESS_NAME)) for s, d in dirs.items()}
    if any(m is None for m in markers.values()):
        return None
    primary = markers[task.split]
    result = ShardResult(
        task,
        processed=False,
        num_records=int(primary.get("num_records", 0)),
        num_empty=int(primary.get("num_empty", 0)),
        num_bad=int(primary.get("num_bad", 0)),
    )
    for s, m in markers.items():
        result.splits[s] = {
            "num_tokens": int(m["num_tokens"]),
            "num_docs": int(m["num_docs"]),
            "num_bytes": int(m.get("bytes", 0)),
        }
    return result


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs for one task (picklable)."""

    task: ShardTask
    output_path: str
    tokenizer_json: str
    options: TokenizeOptions
    dtype: str
    eos_id: int | None
    # Threads of the tokenizer's Rust pool in this worker (None: all cores). Each local
    # worker is a process with its own pool; workers x threads above the core count
    # makes the build slower than one worker.
    threads: int | None = None


def run_shard_job(job: ShardJob) -> ShardResult:
    """Tokenize one input shard unless its cache shard(s) are already finished."""
    done = _finished_result(job.task, _shard_dirs(job.output_path, job.task, job.options))
    if done is not None:
        return done
    if job.threads is not None:
        # Read once, when the process first encodes; a user's own setting wins.
        os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))
    tok = _tokenizer_from_json(job.tokenizer_json)
    return tokenize_shard(
        read_records(job.task.source),
        job.task.source,
        job.task.shard_index,
        job.output_path,
        tok,
        job.options,
        dtype=job.dtype,
        eos_id=job.eos_id,
        split=job.task.split,
        limit=job.task.limit,
    )


# --- planning and the driver ----------------------------------------------------


def expand_sources(sources: str | Sequence[str]) -> list[str]:
    """Input files in order: a glob pattern (sorted matches) or an explicit list (kept in order)."""
    patterns = [sources] if isinstance(sources, str) else list(sources)
    files: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            fsys, p = fs.url_to_fs(pattern)
            matches = sorted(fsys.glob(p))
            protocol = pattern.split("://", 1)[0] + "://" if "://" in pattern else ""
            found = [
                protocol + m if protocol and not m.startswith(protocol) else m for m in matches
            ]
            if not found:
                raise FileNotFoundError(f"no input files match {pattern!r}")
            files.extend(f for f in found if not fs.is_temp_name(f))
        else:
            if not fs.exists(pattern):
                raise FileNotFoundError(f"input file {pattern} does not exist")
            files.append(pattern)
    if not files:
        raise ValueError("no input files given")
    return files


def _sample_limits(
    files: Sequence[str], sample_count: int | None, options: TokenizeOptions
) -> list[int | None]:
    """Per-file document limits that make up the first ``sample_count`` documents."""
    if sample_count is None:
        return [None] * len(files)
    if sample_count <= 0:
        raise ValueError(f"sample_count must be positive, got {sample_count}")
    limits: list[int | None] = []
    remaining = sample_count
    for path in files:
        if remaining == 0:
            limits.append(0)
            continue
        n = sum(
            1
            for _ in iter_documents(
                read_records(path),
                path,
                options.text_key,
                options.id_key,
                skip_bad_records=options.skip_bad_records,
                limit=remaining,
            )
        )
        limits.append(n)
        remaining -= n
    return limits


def run_jobs(
    jobs: Sequence[ShardJob],
    max_workers: int | None,
    backend: str = "local",
    context: ZephyrContext | None = None,
    **context_options: Any,
) -> list[ShardResult]:
    """Run the shard jobs as one Zephyr stage, one shard per job; results in job order.

    On `context` when given (the caller's workers, backend and progress), else on a
    context of its own.
    """
    if not jobs:
        return []
    ds = Dataset.from_list(list(jobs)).reshard(len(jobs)).map(run_shard_job)
    try:
        if context is not None:
            return list(context.execute(ds).results)
        with ZephyrContext(max_workers=max_workers, backend=backend, **context_options) as ctx:
            return list(ctx.execute(ds).results)
    except ShardFailedError as e:
        # A bad record or file is the user's to fix: surface it as itself (file, line,
        # reason), not wrapped in the engine's shard failure.
        if isinstance(e.__cause__, BadRecordError | InputError):
            raise e.__cause__ from None
        raise


def resolve_dtype(tok: Tokenizer, dtype: Any | None) -> np.dtype:
    """The id dtype: the smallest that fits, or the one asked for if the vocabulary fits it."""
    size = vocab_size(tok)
    if dtype is None:
        return dtype_for_vocab(size)
    dt = np.dtype(dtype)
    if dt.name not in ("uint16", "uint32"):
        raise ValueError(f"token id dtype must be uint16 or uint32, got {dt}")
    if size - 1 > np.iinfo(dt).max:
        raise ValueError(
            f"the tokenizer's vocabulary ({size} ids) does not fit {dt.name} token ids "
            f"(max id {np.iinfo(dt).max}); use dtype='uint32' or leave dtype unset"
        )
    return dt


def build_token_cache(
    source_files: str | Sequence[str],
    tokenizer: str | Tokenizer,
    output_path: str,
    *,
    text_key: str = "text",
    id_key: str | None = "id",
    append_eos: bool = True,
    eos_token: str | None = None,
    sample_count: int | None = None,
    validation_fraction: float = 0.0,
    validation_files: str | Sequence[str] | None = None,
    skip_bad_records: bool = False,
    dtype: Any | None = None,
    max_workers: int | None = None,
    backend: str = "local",
    context: ZephyrContext | None = None,
) -> TokenCacheStats:
    """Tokenize ``source_files`` into a token cache at ``output_path``; resumable by shard.

    ``tokenizer``: a Tokenizer, a tokenizer.json path, a directory holding one,
    or a hub name. The validation split is either ``validation_fraction`` of the
    source held out by a stable hash of each document's id (``id_key``; the
    text's hash when a record has none) or the separate ``validation_files``.
    The shards run as a Zephyr stage: on ``context`` when given (its workers,
    backend and progress callback), else on a context of ``max_workers`` on
    ``backend`` ("local" worker processes, "ray", or "inline" in this process).
    """
    if context is not None:
        max_workers, backend = context.max_workers, context.backend_name
    if validation_files is not None and validation_fraction > 0:
        raise ValueError("give either validation_fraction or validation_files, not both")
    options = TokenizeOptions(
        text_key=text_key,
        id_key=id_key,
        append_eos=append_eos,
        validation_fraction=validation_fraction,
        skip_bad_records=skip_bad_records,
    )
    output_path = fs.normalize(output_path)
    # Everything that can be wrong with the tokenizer fails before any work.
    tok = load_tokenizer(tokenizer)
    dt = resolve_dtype(tok, dtype)
    eos_id = find_eos_id(tok, eos_token)
    if append_eos and eos_id is None:
        raise ValueError(
            "append_eos=True but the tokenizer has no end-of-document token (looked for "
            "<|endoftext|>, </s>, <|end_of_text|>, <eos>); pass eos_token=... or append_eos=False"
        )
    files = expand_sources(source_files)
    val_files = expand_sources(validation_files) if validation_files is not None else []

    limits = _sample_limits(files, sample_count, options)
    tasks = [
        ShardTask(f, i, TRAIN, lim) for i, (f, lim) in enumerate(zip(files, limits, strict=True))
    ]
    tasks += [ShardTask(f, i, VALIDATION) for i, f in enumerate(val_files)]
    tokenizer_json = tok.to_str()
    eos_for_jobs = eos_id if append_eos else None
    threads = None
    if backend == "local" and tasks:
        cores = os.cpu_count() or 1
        threads = max(1, cores // max(1, min(max_workers or cores, len(tasks))))
    jobs = [
        ShardJob(t, output_path, tokenizer_json, options, dt.name, eos_for_jobs, threads)
        for t in tasks
    ]

    logger.info(
        "tokenizing %d shards into %s (%s backend, max_workers=%s)",
        len(jobs),
        output_path,
        backend,
        max_workers,
    )
    results = run_jobs(jobs, max_workers, backend, context)

    ledgers: dict[str, dict[str, Any]] = {}
    split_shards: dict[str, list[str]] = {TRAIN: [], VALIDATION: []}
    for r in results:
        for s in r.splits:
            split_shards[s].append(shard_name(r.task.shard_index))
    for s, names in split_shards.items():
        if names:
            ledgers[s] = finalize_split(fs.join(output_path, s), names, dt, eos_for_jobs)
    write_cache_stats(output_path, ledgers)
    processed = sum(r.processed for r in results)
    stats = TokenCacheStats(
        output_path=output_path,
        splits={
            s: {
                "num_tokens": int(lg["num_tokens"]),
                "num_docs": int(lg["num_docs"]),
                "num_bytes": int(lg["num_bytes"]),
                "num_shards": len(lg["shards"]),
            }
            for s, lg in ledgers.items()
        },
        dtype=dt.name,
        eos_id=eos_for_jobs,
        vocab_size=vocab_size(tok),
        shards_total=len(results),
        shards_processed=processed,
        shards_skipped=len(results) - processed,
        num_records=sum(r.num_records for r in results),
        num_empty=sum(r.num_empty for r in results),
        num_bad=sum(r.num_bad for r in results),
    )
    logger.info(
        "token cache %s: %s (%d shards processed, %d already done)",
        output_path,
        stats.splits,
        stats.shards_processed,
        stats.shards_skipped,
    )
    return stats
