"""Build a token cache from text shards: a Zephyr pipeline, one cache shard per input shard.

The pipeline is ``Dataset.from_list(jobs) -> flat_map(tokenize_documents) ->
write_levanter_cache``: one task per cache shard reads its input file, tokenizes
the documents in record order with ``encode_batch_fast`` and writes
``train/part-NNNNN`` with the same index as the input file. With a validation
fraction, a second task per input shard writes its held-out documents to
``validation/part-NNNNN``. Because a shard's bytes depend only on its input file,
the tokenizer and the options, the cache is byte-identical whatever the backend,
worker count or scheduling order.

Resume: Zephyr's ``skip_existing`` skips every shard whose ``.success`` exists
(the writer writes it last). The ledgers and ``.stats.json`` are written after
every task is done, so a killed build leaves nothing that reads as a cache.

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from marin_dagster import fs
from marin_dagster.tokenize.cache import (
    SUCCESS_NAME,
    dtype_for_vocab,
    finalize_cache,
    shard_is_finished,
    shard_name,
)
from marin_dagster.tokenize.records import (
    BadRecordError,
    Document,
    RecordCounts,
    held_out,
    iter_documents,
    read_records,
)
from marin_dagster.tokenize.tokenizer import KNOWN_EOS, find_eos_id, load_tokenizer, vocab_size
from marin_dagster.zephyr import (
    Dataset,
    InputError,
    ShardFailedError,
    ZephyrContext,
    counters,
    get_shared,
)

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
    # The tokenizer's own special tokens (a BOS its post-processor adds), as Levanter encodes.
    add_special_tokens: bool = True
    validation_fraction: float = 0.0
    skip_bad_records: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )


# Which of an input shard's documents a task writes.
ALL = "all"  # every document (no validation fraction, or a separate validation file)
KEPT = "kept"  # the documents not held out for validation
HELD_OUT = "held_out"  # the documents held out (they go to the validation split)

# The tokenizer reaches the workers as a Zephyr shared object (its JSON): once per worker.
_TOKENIZER_SHARED = "marin_dagster.tokenize/tokenizer_json"


@dataclass(frozen=True)
class ShardTask:
    """One input shard's documents (those `select` picks) into cache shard `shard_index`
    of `split`."""

    source: str
    shard_index: int
    split: str  # TRAIN or VALIDATION
    limit: int | None = None  # at most this many documents, before any hold-out (sample_count)
    select: str = ALL  # ALL, KEPT or HELD_OUT

    @property
    def primary(self) -> bool:
        """Whether this task stands for its input shard (counts its records): a held-out
        task reads the same file as the KEPT task beside it."""
        return self.select != HELD_OUT


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
    # Built once per worker process from the shared JSON text (no shared filesystem needed).
    key = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
    tok = _TOKENIZERS.get(key)
    if tok is None:
        tok = _TOKENIZERS[key] = Tokenizer.from_str(tokenizer_json)
    return tok


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


@dataclass(frozen=True)
class ShardJob:
    """One item of the build's pipeline: everything a worker needs for one task (picklable)."""

    task: ShardTask
    options: TokenizeOptions
    eos_id: int | None  # appended after each document (None: no EOS)
    # Threads of the tokenizer's Rust pool in this worker (None: all cores). Each local
    # worker is a process with its own pool; workers x threads above the core count
    # makes the build slower than one worker.
    threads: int | None = None


def tokenize_documents(job: ShardJob, tokenizer: Tokenizer | None = None) -> Iterator[dict]:
    """The documents of `job`'s input shard that it selects, as `{input_ids, num_bytes}`.

    Pure in its inputs: the ids depend only on the records, the tokenizer, the options and
    eos_id. A primary task adds its input shard's record counts to the Zephyr counters
    `num_records`, `num_empty`, `num_bad` (which `write_levanter_cache` keeps in the shard's
    `.success`) once the shard is read.
    """
    task, options = job.task, job.options
    if tokenizer is None:
        if job.threads is not None:
            # Read once, when the process first encodes; a user's own setting wins.
            os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))
        tokenizer = _tokenizer_from_json(get_shared(_TOKENIZER_SHARED))
    eos = None if job.eos_id is None else np.array([job.eos_id], dtype=np.int64)
    counts = RecordCounts()
    docs: Iterable[Document] = iter_documents(
        read_records(task.source),
        task.source,
        options.text_key,
        options.id_key,
        skip_bad_records=options.skip_bad_records,
        counts=counts,
        limit=task.limit,
    )
    if task.select != ALL:
        keep_held_out = task.select == HELD_OUT
        fraction = options.validation_fraction
        docs = (d for d in docs if held_out(d.doc_id, fraction) == keep_held_out)
    for batch in _batches(docs):
        encodings = tokenizer.encode_batch_fast(
            [d.text for d in batch], add_special_tokens=options.add_special_tokens
        )
        for doc, enc in zip(batch, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if eos is not None:
                ids = np.concatenate([ids, eos])
            yield {"input_ids": ids, "num_bytes": doc.num_bytes}
    if task.primary:
        counters.increment("num_records", counts.records)
        counters.increment("num_empty", counts.empty)
        counters.increment("num_bad", counts.bad)


@dataclass(frozen=True)
class _ShardDirs:
    """The output pattern of the build's writer: task i writes folder i."""

    dirs: tuple[str, ...]

    def __call__(self, shard: int, total: int) -> str:
        return self.dirs[shard]


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
    add_special_tokens: bool = True,
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
        add_special_tokens=add_special_tokens,
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
            f"{', '.join(KNOWN_EOS)}); name its own with eos_token=... or pass append_eos=False"
        )
    files = expand_sources(source_files)
    val_files = expand_sources(validation_files) if validation_files is not None else []

    limits = _sample_limits(files, sample_count, options)
    tasks: list[ShardTask] = []
    for i, (f, lim) in enumerate(zip(files, limits, strict=True)):
        if validation_fraction > 0:
            # The held-out task first: with one worker, a finished train shard then means
            # its input shard is done.
            tasks.append(ShardTask(f, i, VALIDATION, lim, HELD_OUT))
            tasks.append(ShardTask(f, i, TRAIN, lim, KEPT))
        else:
            tasks.append(ShardTask(f, i, TRAIN, lim, ALL))
    tasks += [ShardTask(f, i, VALIDATION) for i, f in enumerate(val_files)]
    # Levanter's enforce_eos: one EOS per document, so none appended where the tokenizer's
    # template already ends each encoding with it (probed once, as Levanter does).
    template_eos = (
        add_special_tokens and eos_id is not None and tok.encode("a").ids[-1:] == [eos_id]
    )
    eos_for_jobs = eos_id if append_eos and not template_eos else None
    threads = None
    if backend == "local":
        cores = os.cpu_count() or 1
        threads = max(1, cores // max(1, min(max_workers or cores, len(tasks))))
    jobs = [ShardJob(t, options, eos_for_jobs, threads) for t in tasks]
    dirs = [fs.join(output_path, t.split, shard_name(t.shard_index)) for t in tasks]
    finished_before = [shard_is_finished(d) for d, t in zip(dirs, tasks, strict=True) if t.primary]

    logger.info(
        "tokenizing %d input shards into %s (%s backend, max_workers=%s)",
        len(files) + len(val_files),
        output_path,
        backend,
        max_workers,
    )
    # One Zephyr stage, one task per cache shard: read and tokenize the input shard, write
    # the cache shard. skip_existing leaves finished shards (their .success) alone: resume.
    pipeline = (
        Dataset.from_list(jobs)
        .reshard(len(jobs))
        .flat_map(tokenize_documents)
        .write_levanter_cache(_ShardDirs(tuple(dirs)), dtype=dt.name, skip_existing=True)
    )
    try:
        if context is not None:
            _execute(context, pipeline, tok)
        else:
            with ZephyrContext(max_workers=max_workers, backend=backend) as ctx:
                _execute(ctx, pipeline, tok)
    except ShardFailedError as e:
        # A bad record or file is the user's to fix: surface it as itself (file, line,
        # reason), not wrapped in the engine's shard failure.
        if isinstance(e.__cause__, BadRecordError | InputError):
            raise e.__cause__ from None
        raise

    split_shards: dict[str, list[str]] = {TRAIN: [], VALIDATION: []}
    for t, d in zip(tasks, dirs, strict=True):
        split_shards[t.split].append(d)
    ledgers = finalize_cache(output_path, split_shards, dt, eos_for_jobs)
    markers = [
        fs.read_json(fs.join(d, SUCCESS_NAME))
        for d, t in zip(dirs, tasks, strict=True)
        if t.primary
    ]
    processed = finished_before.count(False)
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
        shards_total=len(markers),
        shards_processed=processed,
        shards_skipped=len(markers) - processed,
        num_records=sum(int(m.get("num_records", 0)) for m in markers),
        num_empty=sum(int(m.get("num_empty", 0)) for m in markers),
        num_bad=sum(int(m.get("num_bad", 0)) for m in markers),
    )
    logger.info(
        "token cache %s: %s (%d input shards tokenized, %d already done)",
        output_path,
        stats.splits,
        stats.shards_processed,
        stats.shards_skipped,
    )
    return stats


def _execute(ctx: ZephyrContext, pipeline: Dataset, tok: Tokenizer) -> None:
    ctx.put(_TOKENIZER_SHARED, tok.to_str())
    ctx.execute(pipeline)
