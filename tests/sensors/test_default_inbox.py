"""The default code location's inbox: JSONL files dropped there are built by a real daemon."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import dagster as dg

from marin_dagster.execution.tags import WATCH_TAG
from tests.conftest import REPO
from tests.ui.dagster_process import dagster_process, log_tail

SENSOR = "inbox__inbox_sensor"
BUILT = (
    ["raw", "inbox_raw"],
    ["dedup", "inbox_dedup"],
    ["tokenizers", "inbox-bpe_tokenizer"],
    ["tokenized", "inbox_tokens"],
)


def _records(n: int, offset: int = 0) -> str:
    """`n` unrelated documents of 60 words (record i is the same whichever file holds it)."""
    vocabulary = [
        f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "su", "ta", "ve", "ro") for b in "aeiouyxz"
    ]
    lines = []
    for i in range(offset, offset + n):
        rng = random.Random(i)
        lines.append(json.dumps({"text": " ".join(rng.choice(vocabulary) for _ in range(60))}))
    return "\n".join(lines) + "\n"


def test_jsonl_dropped_in_the_inbox_is_deduplicated_and_tokenized(tmp_path, dagster_home):
    inbox, prefix = tmp_path / "inbox", tmp_path / "data"
    log = str(tmp_path / "daemon.log")
    daemon = os.path.join(os.path.dirname(sys.executable), "dagster-daemon")
    with dagster_process(
        [daemon, "run", "-m", "marin_dagster.definitions"],
        log,
        cwd=REPO,
        DAGSTER_HOME=dagster_home,
        MARIN_PREFIX=str(prefix),
        MARIN_INBOX=str(inbox),
    ) as proc:
        # The daemon ticks the (empty, just created) inbox first: no run for nothing.
        deadline = time.time() + 120
        while not inbox.exists() and time.time() < deadline:
            assert proc.poll() is None, log_tail(log)
            time.sleep(1)
        time.sleep(12)
        with dg.DagsterInstance.get() as instance:
            assert not instance.get_runs(filters=dg.RunsFilter(tags={WATCH_TAG: SENSOR}))
        for part in range(3):  # a burst of three files
            (inbox / f"part{part}.jsonl").write_text(_records(40, 40 * part))
        (inbox / "dup.jsonl").write_text(_records(40))  # a copy of part0: dedup drops it
        with dg.DagsterInstance.get() as instance:
            deadline = time.time() + 900
            runs: list = []
            while time.time() < deadline:
                assert proc.poll() is None, f"the daemon exited:\n{log_tail(log)}"
                runs = instance.get_runs(filters=dg.RunsFilter(tags={WATCH_TAG: SENSOR}))
                if runs and all(r.is_finished for r in runs):
                    break
                time.sleep(2)
            assert len(runs) == 1, [r.tags for r in runs]
            run = runs[0]
            assert run.status == dg.DagsterRunStatus.SUCCESS, log_tail(log)
            assert run.job_name == "inbox_job"
            assert run.asset_selection == {dg.AssetKey(k) for k in BUILT}
            meta = {
                tuple(k): instance.get_latest_materialization_event(
                    dg.AssetKey(k)
                ).asset_materialization.metadata
                for k in BUILT
            }
    assert meta[("raw", "inbox_raw")]["documents"].value == 160
    kept = meta[("dedup", "inbox_dedup")]
    assert kept["document_kept"].value == 120  # dup.jsonl repeats part0.jsonl
    assert meta[("tokenized", "inbox_tokens")]["tokens"].value > 0
