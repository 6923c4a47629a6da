"""`deduplicate`: the dedup entry point, exact, paragraph or fuzzy, on Zephyr.

Stages (each a Zephyr execution; every file written atomically):

1. hashes: per input file, document or paragraph hashes (exact modes), or
   MinHash signatures and LSH band records (fuzzy);
2. groups: group_by hash (exact: keep the smallest node key, mark the rest),
   or group_by band bucket -> candidate links -> connected components
   (fuzzy: `components.py`), then duplicate marks grouped by input file;
3. outputs: each input file read beside its marks, written as documents and
   attributes; per-file counts summed into `counts.json`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from marin_dagster import fs
from marin_dagster.dupekit.components import ComponentsResult, build_nodes, propagate_labels
from marin_dagster.dupekit.exact import (
    DocumentHashes,
    ParagraphHashes,
    first_of_document_group,
    first_of_paragraph_group,
    hash_of,
)
from marin_dagster.dupekit.lsh import LSHParams
from marin_dagster.dupekit.outputs import (
    WriteMarks,
    WriteOutputs,
    attributes_names,
    file_of,
    mark_order,
)
from marin_dagster.dupekit.records import DEFAULT_ID_KEY, key_id, key_position, resolve_sources
from marin_dagster.dupekit.shingles import ShingleConfig
from marin_dagster.words import a_type, checked_keywords
from marin_dagster.zephyr import Dataset, ZephyrContext
from marin_dagster.zephyr import counters as zephyr_counters

logger = logging.getLogger(__name__)

DedupMode = Literal["exact", "paragraph", "fuzzy"]
# Recall-leaning LSH weights (false positive, false negative): at the default
# threshold 0.8 and 128 permutations they give 14 bands x 9 rows, which links
# a pair of Jaccard 0.85 with probability 0.975 (datasketch's balanced (0.5,
# 0.5) gives 9 x 13 and 0.69). Verification removes the extra candidates.
DEFAULT_LSH_WEIGHTS = (0.15, 0.85)
MAX_CHARS = 500_000


# The MinHash-LSH settings: the other modes hash whole documents or paragraphs.
FUZZY_ONLY = frozenset(
    {
        "shingle",
        "ngram",
        "num_perm",
        "seed",
        "threshold",
        "bands",
        "rows",
        "lsh_weights",
        "verify",
        "verify_margin",
        "bucket_partitions",
        "cc_max_iterations",
    }
)


@checked_keywords
@dataclass(frozen=True)
class DedupConfig:
    """Everything that decides a dedup's output (worker counts and backend do not)."""

    mode: DedupMode = "exact"
    text_key: str = "text"
    id_key: str = DEFAULT_ID_KEY
    shingle: Literal["char", "word"] = "char"
    ngram: int = 5
    num_perm: int = 128
    seed: int = 42
    threshold: float = 0.8
    bands: int | None = None
    rows: int | None = None
    lsh_weights: tuple[float, float] = DEFAULT_LSH_WEIGHTS
    # The exact check of doubtful links, on by default because it is what makes removals
    # safe: every removed document is joined to its cluster's kept document through links
    # whose shingle-set Jaccard reaches the threshold (links estimated at threshold +
    # verify_margin or more are trusted on 128 matches, the rest are checked exactly).
    # verify=False links every pair that shares one band bucket, with no Jaccard test: at
    # the default 14 bands x 9 rows a pair of Jaccard 0.6 links with probability 0.13
    # and 0.5 with 0.03, and links chain. Its cost, measured on the 52k-document benchmark
    # corpus of docs/benchmarks.md (2 KB passages, copies with 0-30% of words edited):
    # 2,519 documents removed without any document of Jaccard >= 0.7 in their cluster,
    # against 0 with verify=True, for 10-20% less time (docs/benchmarks.md, Dedup).
    verify: bool = True
    # With verify: a pair estimated in [threshold, threshold + verify_margin) is linked only
    # if its exact shingle-set Jaccard reaches the threshold; one above, on its estimate. At
    # 128 permutations and threshold 0.8, a pair of Jaccard 0.7 gets an estimate of 0.9 or
    # more with probability 2e-8 (the binomial tail): no link joins documents that far apart.
    verify_margin: float = 0.1
    # Fuzzy signs, and paragraph mode hashes the paragraphs of, a document's first max_chars
    # characters; exact mode hashes every document whole.
    max_chars: int = MAX_CHARS
    num_shards: int | None = None
    # Band entries are shuffled by partition of the bucket key; a reducer holds
    # one partition, about bands * documents / bucket_partitions entries.
    bucket_partitions: int = 256
    cc_max_iterations: int = 64

    def __post_init__(self) -> None:
        # Types first: threshold="0.7" failed in a comparison that named no field.
        for f in fields(self):
            value, kind = getattr(self, f.name), f.type.replace(" | None", "")
            if value is None and f.type.endswith("| None"):
                continue
            wanted = {"float": (int, float), "int": (int,), "str": (str,), "bool": (bool,)}.get(
                kind
            )
            if wanted and (
                not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool))
            ):
                raise TypeError(
                    f"{f.name} must be {'an' if kind == 'int' else 'a'} {kind}, got "
                    f"{a_type(value)} ({value!r})"
                )
        if self.mode not in ("exact", "paragraph", "fuzzy"):
            raise ValueError(f"mode must be 'exact', 'paragraph' or 'fuzzy', not {self.mode!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 <= self.verify_margin <= 1.0:
            raise ValueError(f"verify_margin must be in [0, 1], got {self.verify_margin}")
        for name in ("ngram", "num_perm", "max_chars", "cc_max_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:  # MinHash permutations come from RandomState(seed)
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.bucket_partitions < 1:
            raise ValueError(f"bucket_partitions must be positive, got {self.bucket_partitions}")
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"num_shards must be positive, got {self.num_shards}")
        ShingleConfig(self.shingle, self.ngram)
        if self.mode == "fuzzy":
            if self.bands is not None or self.rows is not None:
                self.lsh_params()
            # else the search picks them at run time from the threshold checked above; here it
            # would cost every code location load scipy's import (0.4 s).
        else:
            # They would change nothing but the version: a new version reruns the dedup and
            # everything after it for the same output.
            given = [
                f.name
                for f in fields(self)
                if f.name in FUZZY_ONLY and getattr(self, f.name) != f.default
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to "
                    f"mode='fuzzy', not {self.mode!r}: remove {'them' if len(given) > 1 else 'it'}"
                    ", or set mode='fuzzy'"
                )
            if self.mode == "exact" and self.max_chars != MAX_CHARS:
                raise ValueError(
                    "max_chars does nothing in mode='exact', which hashes every document whole "
                    "(two documents equal in their first max_chars characters are not "
                    "duplicates): remove it"
                )

    def settings(self) -> dict[str, Any]:
        """The fields that shape this mode's output (counts.json, the run log): the others
        sit at their defaults, refused otherwise, and say nothing."""
        unused = set() if self.mode == "fuzzy" else set(FUZZY_ONLY)
        if self.mode == "exact":
            unused.add("max_chars")
        return {k: v for k, v in asdict(self).items() if k not in unused}

    def lsh_params(self) -> LSHParams:
        from marin_dagster.dupekit.lsh import optimal_param

        if self.bands is None and self.rows is None:
            return LSHParams(
                *optimal_param(float(self.threshold), self.num_perm, tuple(self.lsh_weights))
            )
        return LSHParams.resolve(self.num_perm, self.threshold, self.bands, self.rows)


@dataclass
class DedupResult:
    """What `deduplicate` produced: counts (also in `counts.json`) and where the outputs are."""

    output_path: str
    counts: dict[str, Any]
    documents: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    def flat_counts(self) -> dict[str, int | float]:
        """`{"document/total": ..., "paragraph/duplicates": ..., ...}` for asset metadata."""
        out: dict[str, int | float] = {}
        for level, values in self.counts.items():
            if isinstance(values, dict):
                for name, value in values.items():
                    if isinstance(value, int | float):
                        out[f"{level}/{name}"] = value
        return out


class _LoggedContext:
    """The run's ZephyrContext, logging how long each execution takes."""

    def __init__(self, ctx: ZephyrContext):
        self._ctx = ctx

    def execute(self, dataset: Dataset) -> Any:
        start = time.perf_counter()
        result = self._ctx.execute(dataset)
        logger.info("dedup: %.2fs for %s", time.perf_counter() - start, dataset)
        return result


def _links_as_pairs(state: dict) -> Iterator[dict]:
    if state["adj"]:  # a node whose doubtful links all failed their check has none
        zephyr_counters.increment("dedup/fuzzy/linked_documents")
    for other in state["adj"]:
        if state["node"] < other:
            yield {"a": key_id(state["node"]), "b": key_id(other)}


def _node_mark(state: dict) -> Iterator[dict]:
    if state["label"] != state["node"]:
        file_index, record_index = key_position(state["node"])
        yield {"file": file_index, "record": record_index, "cluster": state["label"]}


def deduplicate(
    source_files: str | Sequence[str],
    output_path: str,
    config: DedupConfig = DedupConfig(),  # noqa: B008 -- frozen, so one shared default is safe
    *,
    max_workers: int | None = None,
    backend: str = "local",
    context: ZephyrContext | None = None,
) -> DedupResult:
    """Deduplicate documents into `output_path` (see docs/dupekit.md for the layout).

    `source_files`: a glob, a file, or a list of files (JSONL, plain/.gz/.zst; Parquet; CSV;
    each file's documents are written back in its format). `config` decides the output;
    how it runs does not: the run uses `context` if given (its workers, backend and
    progress), else a ZephyrContext of `max_workers` on `backend`, shut down at the end.
    """
    sources = resolve_sources(source_files)
    attribute_files = attributes_names([s.relative for s in sources])  # refused before work
    output_path = fs.normalize(output_path)
    # Shard counts follow the input, never the worker count, so the outputs are
    # the same on any number of workers.
    shards = config.num_shards or min(64, max(1, len(sources)))
    work = fs.join(output_path, "_work")
    fs.remove(work, recursive=True)
    fs.remove(fs.join(output_path, "counts.json"))
    own_context = context is None
    zephyr_ctx = context or ZephyrContext(max_workers=max_workers, backend=backend)
    ctx = _LoggedContext(zephyr_ctx)
    try:
        counts_extra, counters = _find_duplicates(config, sources, output_path, work, shards, ctx)
        marks_dir = fs.join(work, "marks")
        writer = WriteOutputs(
            config.mode,
            config.text_key,
            config.id_key,
            marks_dir,
            fs.join(output_path, "documents"),
            fs.join(output_path, "attributes"),
            attribute_files,
        )
        final = ctx.execute(Dataset.from_list(sources).reshard(len(sources)).map(writer))
    finally:
        if own_context:
            zephyr_ctx.shutdown()
    per_file = sorted(final.results, key=lambda r: r["file"])
    counters.update(
        {
            k: v
            for k, v in final.counters.as_dict().items()
            if k.startswith("dedup/") and not k.endswith(("/max", "/min", "/mean"))
        }
    )
    # Through JSON, so the returned counts equal counts.json (tuples become lists).
    counts = json.loads(json.dumps(_summarize(config, per_file, counters, counts_extra)))
    fs.remove(work, recursive=True)
    fs.write_json(fs.join(output_path, "counts.json"), counts)
    logger.info("dedup %s of %d files: %s", config.mode, len(sources), counts["document"])
    return DedupResult(
        output_path,
        counts,
        [r["documents_file"] for r in per_file],
        [r["attributes_file"] for r in per_file],
        counters,
    )


def _find_duplicates(
    config: DedupConfig,
    sources: list,
    output_path: str,
    work: str,
    shards: int,
    ctx: _LoggedContext,
) -> tuple[dict, dict[str, float]]:
    """Stages 1-2: writes `{work}/marks/file-*.jsonl.gz`; returns extra counts and counters."""
    files = Dataset.from_list(sources).reshard(len(sources))
    write_marks = WriteMarks(fs.join(work, "marks"))
    counters: dict[str, float] = {}

    def keep(result_counters: dict[str, float]) -> None:
        counters.update(
            {
                k: v
                for k, v in result_counters.items()
                if k.startswith("dedup/") and not k.endswith(("/max", "/min", "/mean"))
            }
        )

    extra: dict[str, Any] = {}
    if config.mode in ("exact", "paragraph"):
        if config.mode == "exact":
            hashes = files.flat_map(DocumentHashes(config.text_key, config.id_key))
            reducer = first_of_document_group
        else:
            hashes = files.flat_map(
                ParagraphHashes(config.text_key, config.id_key, config.max_chars)
            )
            reducer = first_of_paragraph_group
        keep(
            ctx.execute(
                hashes.group_by(key=hash_of, reducer=reducer, num_output_shards=shards).group_by(
                    key=file_of, reducer=write_marks, sort_by=mark_order, num_output_shards=shards
                )
            ).counters.as_dict()
        )
        return extra, counters

    # Imported here: fuzzy stages need JAX, exact ones do not.
    from marin_dagster.dupekit.fuzzy import (
        BandRecords,
        BucketLinks,
        FuzzySettings,
        bucket_partition,
    )

    lsh = config.lsh_params()
    settings = FuzzySettings(
        ShingleConfig(config.shingle, config.ngram),
        config.num_perm,
        config.seed,
        lsh,
        config.threshold,
        config.verify,
    )
    bands = files.flat_map(
        BandRecords(
            config.text_key,
            config.id_key,
            config.max_chars,
            settings,
            fs.join(output_path, "signatures"),
            config.bucket_partitions,
        )
    )
    links = bands.group_by(
        key=bucket_partition,
        reducer=BucketLinks(config.verify, config.threshold, config.num_perm, config.verify_margin),
        num_output_shards=shards,
    )
    fs.remove(fs.join(output_path, "links"), recursive=True)
    cc_dir = fs.join(work, "cc")
    graph = build_nodes(links, ctx, cc_dir, shards)
    keep(graph.first_counters)
    if graph.first_counters.get("dedup/fuzzy/doubtful_ends", 0):
        keep(_check_doubtful_links(config, sources, graph, shards, ctx))
    components = propagate_labels(graph, ctx, cc_dir, shards, config.cc_max_iterations)
    extra["fuzzy"] = {
        "bands": lsh.bands,
        "rows": lsh.rows,
        "cc_iterations": components.iterations,
        "linked_documents": 0,
        "linked_pairs": 0,
    }
    if config.verify:
        extra["fuzzy"]["exact_checked"] = int(counters.get("dedup/fuzzy/exact_checked", 0))
        extra["fuzzy"]["exact_rejected"] = int(counters.get("dedup/fuzzy/exact_rejected", 0))
    if components.nodes:
        nodes = Dataset.from_files(components.node_files).load_jsonl()
        pairs = ctx.execute(
            nodes.flat_map(_links_as_pairs).write_jsonl(
                fs.join(output_path, "links", "part-{shard:05d}-of-{total:05d}.jsonl.gz")
            )
        )
        extra["fuzzy"]["linked_pairs"] = int(pairs.counters["records_written"])
        extra["fuzzy"]["linked_documents"] = int(
            pairs.counters.get("dedup/fuzzy/linked_documents", 0)
        )
        ctx.execute(
            nodes.flat_map(_node_mark).group_by(
                key=file_of, reducer=write_marks, sort_by=mark_order, num_output_shards=shards
            )
        )
    return extra, counters


def _check_doubtful_links(
    config: DedupConfig, sources: list, graph: ComponentsResult, shards: int, ctx: _LoggedContext
) -> dict[str, float]:
    """Rereads both documents of each doubtful link and adds the links whose exact Jaccard holds.

    The links that hold are written beside the graph's node files, which adds
    them to the graph in the first round of label propagation.
    """
    from marin_dagster.dupekit.fuzzy import (
        ExactJaccard,
        ShingleSets,
        doubtful_ends,
        file_of_request,
        pair_of,
        pair_partition,
    )

    reread = ShingleSets(
        tuple(sources),
        config.text_key,
        config.id_key,
        config.max_chars,
        ShingleConfig(config.shingle, config.ngram),
    )
    return ctx.execute(
        Dataset.from_files(graph.node_files)
        .load_jsonl()
        .flat_map(doubtful_ends)
        .group_by(key=file_of_request, reducer=reread, num_output_shards=shards)
        .group_by(
            key=pair_partition,
            reducer=ExactJaccard(config.threshold),
            sort_by=pair_of,
            num_output_shards=shards,
        )
        .write_jsonl(fs.join(graph.folder, "added-{shard:05d}-of-{total:05d}.jsonl.gz"))
    ).counters.as_dict()


def _summarize(
    config: DedupConfig, per_file: list[dict], counters: dict[str, float], extra: dict[str, Any]
) -> dict[str, Any]:
    def total(name: str) -> int:
        return int(sum(r[name] for r in per_file))

    def counter(name: str) -> int:
        return int(counters.get(name, 0))

    documents = total("documents")
    document = {
        "total": documents,
        "kept": total("kept"),
        "passed_through": counter("dedup/document/passed_through"),
        # Documents holding lone surrogates: hashed with U+FFFD in their place, written as read.
        "unencodable": counter("dedup/document/unencodable"),
    }
    if config.mode != "exact":  # exact mode hashes whole documents
        document["truncated"] = counter("dedup/document/truncated")
    if config.mode == "paragraph":
        document["emptied"] = total("documents_emptied")
        document["duplicates"] = 0
        document["unique"] = documents
    else:
        document["duplicates"] = total("duplicates")
        document["unique"] = documents - document["duplicates"]
    counts: dict[str, Any] = {
        "mode": config.mode,
        "config": config.settings(),
        "files": len(per_file),
        "document": document,
    }
    if config.mode == "paragraph":
        paragraphs = counter("dedup/paragraph/total")
        duplicates = total("paragraphs_removed")
        counts["paragraph"] = {
            "total": paragraphs,
            "duplicates": duplicates,
            "unique": paragraphs - duplicates,
            "chars_removed": total("chars_removed"),
        }
    counts.update(extra)
    return counts
