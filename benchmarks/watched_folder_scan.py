"""A sensor tick on a 10,000-file watched folder, against Dagster's 60 s evaluation limit.

Peers measured in the same run: a cold scan (every file read and hashed, as on
the first tick after a code-server restart), a polling tick (every file
statted, only changed files hashed) and a watchdog tick (only changed paths
looked at). Prints seconds and each tick's share of the 60 s limit.

    .venv/bin/python benchmarks/watched_folder_scan.py [--files 10000]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this folder comes first on sys.path, where the sibling tokenize.py would
# shadow the standard library's tokenize module: import from the repository root instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from marin_dagster.datasets.watch import FolderState  # noqa: E402

LIMIT_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.files):
            sub = os.path.join(folder, f"d{i % 50:02d}")
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, f"f{i:06d}.txt"), "w") as f:
                f.write(f"document {i}\n" * 20)
        results = {}
        for mode, watch in (("polling", False), ("watchdog", True)):
            state = FolderState(folder, watch=watch)
            t = time.perf_counter()
            cold = state.snapshot()
            results.setdefault(
                "cold scan (hash every file)", (time.perf_counter() - t, cold.hashed)
            )
            for i in range(args.changed):
                path = os.path.join(folder, f"d{i % 50:02d}", f"f{i:06d}.txt")
                with open(path, "a") as f:
                    f.write(f"{mode} edit\n")
            time.sleep(0.5)  # let watchdog deliver its events
            t = time.perf_counter()
            tick = state.snapshot()
            results[f"{mode} tick after {args.changed} edits"] = (
                time.perf_counter() - t,
                tick.hashed,
            )
            state.close()
        print(f"{args.files} files; Dagster stops a sensor evaluation after {LIMIT_S:.0f} s")
        for name, (seconds, hashed) in results.items():
            print(
                f"  {name:<34} {seconds:8.3f} s  {hashed:6d} hashed  {seconds / LIMIT_S:8.2%} of the limit"
            )
        cold_s = results["cold scan (hash every file)"][0]
        for mode in ("polling", "watchdog"):
            tick_s = results[f"{mode} tick after {args.changed} edits"][0]
            print(f"  cold scan / {mode} tick: {cold_s / max(tick_s, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
