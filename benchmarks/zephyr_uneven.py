"""Zephyr on files of uneven sizes: largest-first dispatch against shard order.

    .venv/bin/python benchmarks/zephyr_uneven.py [--mb 100] [--workers 2] [--rounds 3]

Both workloads of benchmarks/zephyr_pipeline.py (records of about 200 bytes,
documents of about 2 KB), each cut into two corpora of --mb of JSONL:

- uneven: seven files of a tenth each and one of three tenths, named so that the
  large one comes last (as a final, larger dump or a merged shard would);
- even: eight files of an eighth each, where the order cannot matter.

The same map/filter -> Parquet pipeline runs over each with Zephyr's shipped dispatch
(a stage over files starts the largest first) and with shard order (the dispatch
before it), interleaved, best of --rounds. Ratios are printed; all figures come from
this run.
"""

# ruff: noqa: E402  (sys.path is fixed before the imports below)
from __future__ import annotations

import os
import sys

# As in zephyr_pipeline.py: this folder must not shadow stdlib modules (tokenize.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import glob
import shutil
import tempfile

import cloudpickle

from marin_dagster.zephyr import context as zephyr_context

sys.path.append(_HERE)  # after the imports above: zephyr_pipeline is a sibling script
import zephyr_pipeline as zp

# Its functions travel to the workers by value: importing it takes this folder off sys.path.
cloudpickle.register_pickle_by_value(zp)

SHAPES = {"uneven": [1] * 7 + [3], "even": [1] * 8}
SHIPPED = zephyr_context._largest_first


def cut(lines: list[bytes], folder: str, weights: list[int]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    total, start = sum(weights), 0
    for k, w in enumerate(weights):
        stop = start + len(lines) * w // total if k < len(weights) - 1 else len(lines)
        with open(os.path.join(folder, f"part-{k}.jsonl"), "wb") as f:
            f.writelines(lines[start:stop])
        start = stop


def run(pattern: str, out: str, workers: int, min_words: int, largest_first: bool) -> float:
    zephyr_context._largest_first = SHIPPED if largest_first else (lambda pending, _inputs: pending)
    try:
        return zp.run_zephyr(pattern, out, workers, False, min_words)[0]
    finally:
        zephyr_context._largest_first = SHIPPED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="JSONL per corpus")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "zephyr-bench"))
    ap.add_argument("--shakespeare-cache", default="/tmp/shk")
    args = ap.parse_args()
    patterns = {}
    for wl in zp.WORKLOADS:
        lines: list[bytes] = []
        for f in zp.corpus(args.work, wl, args.mb, args.shakespeare_cache):
            with open(f, "rb") as fh:
                lines += fh.readlines()
            if sum(map(len, lines)) >= args.mb << 20:
                break
        while sum(map(len, lines)) > args.mb << 20:
            lines.pop()
        for shape, weights in SHAPES.items():
            folder = os.path.join(args.work, f"uneven-{wl}-{shape}")
            cut(lines, folder, weights)
            patterns[wl, shape] = os.path.join(folder, "part-*.jsonl")
            sizes = [os.path.getsize(p) >> 20 for p in sorted(glob.glob(patterns[wl, shape]))]
            print(f"{wl}, {shape}: files of {sizes} MB")
    print(f"cpus: {os.cpu_count()}; workers: {args.workers}; load: {os.getloadavg()[0]:.2f}")
    best: dict[tuple, float] = {}
    for k in range(args.rounds):
        print(f"round {k + 1}:", end="", flush=True)
        for (wl, shape), pattern in patterns.items():
            for largest_first in (False, True):
                out = os.path.join(args.work, f"uneven-out-{wl}-{shape}")
                s = run(pattern, out, args.workers, zp.MIN_WORDS[wl], largest_first)
                key = (wl, shape, largest_first)
                best[key] = min(s, best.get(key, s))
                name = "largest first" if largest_first else "shard order"
                print(f" {wl[:3]} {shape} {name} {s:.2f}", end=";", flush=True)
        print()
    print(f"best of {args.rounds} interleaved rounds; load at the end {os.getloadavg()[0]:.2f}")
    for (wl, shape), _ in patterns.items():
        order, first = best[wl, shape, False], best[wl, shape, True]
        print(
            f"  {wl:9s} {shape:6s} shard order {order:5.2f} s, largest first {first:5.2f} s: "
            f"{order / first:.2f}x"
        )


if __name__ == "__main__":
    main()
