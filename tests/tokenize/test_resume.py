"""A build killed with SIGKILL mid-run resumes by shard: finished shards are not redone."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

from marin_dagster.tokenize.build import build_token_cache
from tests.conftest import subprocess_env
from tests.tokenize.conftest import write_jsonl_gz
from tests.tokenize.test_build import tree_bytes

NUM_SHARDS = 10


def _finished(out: str) -> list[str]:
    return sorted(os.path.dirname(p) for p in glob.glob(f"{out}/train/part-*/.success"))


def test_sigkill_mid_run_redoes_only_unfinished_shards(tmp_path, shakespeare_records, bpe_dir):
    half = shakespeare_records[: len(shakespeare_records) // 3]
    shards = [
        write_jsonl_gz(
            str(tmp_path / "in" / f"part-{i:05d}.jsonl.gz"),
            [{**r, "id": f"{i}/{r['id']}"} for r in half],
        )
        for i in range(NUM_SHARDS)
    ]
    out = str(tmp_path / "cache")
    code = (
        "import sys; from marin_dagster.tokenize.build import build_token_cache; "
        "build_token_cache(sys.argv[1:-2], sys.argv[-2], sys.argv[-1], validation_fraction=0.1,"
        " backend='inline')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *shards, bpe_dir, out],
        env=subprocess_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while len(_finished(out)) < 2:
        assert proc.poll() is None, (
            f"the build ended before it could be killed: {proc.stderr.read()}"
        )
        assert time.monotonic() < deadline, "no shard finished in time"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _finished(out)
    assert 2 <= len(done) < NUM_SHARDS
    assert not os.path.exists(f"{out}/train/shard_ledger.json")
    assert not os.path.exists(f"{out}/.stats.json")
    before = {d: os.stat(f"{d}/input_ids.npy").st_mtime_ns for d in done}

    stats = build_token_cache(shards, bpe_dir, out, validation_fraction=0.1, backend="inline")
    assert stats.shards_processed == NUM_SHARDS - len(done)
    assert stats.shards_skipped == len(done)
    # The finished shards were left alone.
    assert {d: os.stat(f"{d}/input_ids.npy").st_mtime_ns for d in done} == before

    # And the resumed cache is byte for byte the uninterrupted one.
    clean = str(tmp_path / "clean")
    build_token_cache(shards, bpe_dir, clean, validation_fraction=0.1, backend="inline")
    assert tree_bytes(out) == tree_bytes(clean)
