"""What a Zephyr worker imports to run the factories' tasks: never Dagster, nor `assets`.

A worker imports a task's module to unpickle it. A task function defined in `assets/` made
each fresh worker import Dagster, the resources and every factory (2-3 s on this machine)
before its first record. Here every task the factories send (fetch, paragraph and fuzzy
dedup, tokenizer training, tokenize, stats) is captured as the driver sends it, and loaded
in a fresh interpreter, as a worker loads it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg

import marin_dagster.zephyr.backends.local as local
from assets import dataset, dataset_stats, deduplicated, tokenized, tokenizer
from resources.ducky import stats_duckdb
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource
from tests.conftest import subprocess_env

HEAVY = ("dagster", "assets", "resources", "duckdb")  # the last only where stats asks for it

LOAD = """
import json, sys, cloudpickle
task = cloudpickle.loads(open(sys.argv[1], "rb").read())
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_the_factories_tasks_load_without_dagster(tmp_path, monkeypatch):
    sent: dict[str, bytes] = {}
    dumps = local.dumps_task

    def record(task):  # type: ignore[no-untyped-def]
        payload = dumps(task)
        sent.setdefault(task.stage_name, payload)
        return payload

    monkeypatch.setattr(local, "dumps_task", record)
    src = tmp_path / "corpus"
    src.mkdir()
    texts = [
        f"Document {i}: " + "the quick brown fox jumps over the lazy dog " * 5 for i in range(60)
    ]
    for k in range(2):
        (src / f"part-{k}.jsonl").write_text(
            "".join(json.dumps({"id": f"{k}-{i}", "text": t}) + "\n" for i, t in enumerate(texts))
        )
    raw = dataset("raw/imports", str(src))
    fuzzy = deduplicated("dedup/imports-fuzzy", source=raw, mode="fuzzy")
    paragraphs = deduplicated("dedup/imports-paragraphs", source=raw, mode="paragraph")
    tok = tokenizer("tokenizers/imports", source=fuzzy, vocab_size=300)
    tokens = tokenized("tokenized/imports", source=fuzzy, tokenizer=tok)
    stats = dataset_stats("stats/imports", datasets=[fuzzy, tokens])
    prefix = str(tmp_path / "data")
    resources = {
        "storage": StorageResource(prefix=prefix),
        "zephyr": ZephyrResource(max_workers=2),
        "duckdb": stats_duckdb(prefix),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, fuzzy, paragraphs, tok, tokens, stats], instance=instance, resources=resources
        )
    assert result.success
    assert len(sent) >= 6, sorted(sent)  # fetch, two dedups' stages, tokenize, stats
    for stage, payload in sorted(sent.items()):
        path = tmp_path / "task.pkl"
        path.write_bytes(payload)
        proc = subprocess.run(
            [sys.executable, "-c", LOAD, str(path)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        loaded = set(json.loads(proc.stdout))
        allowed = {"duckdb"} if "measure" in stage else set()
        assert not (loaded & set(HEAVY)) - allowed, f"{stage}: {sorted(loaded & set(HEAVY))}"
