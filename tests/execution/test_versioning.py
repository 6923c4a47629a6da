"""Versioned assets on a real Dagster instance, on local disk and on gs:// (the GCS emulator)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import pydantic
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from marin_dagster import fs
from marin_dagster.execution.status import MANIFEST_FILE, StepStatus, read_status
from resources.storage import StorageResource
from tests.conftest import REPO, subprocess_env
from tests.execution.chunked import chunk_bytes, chunked


def _events(counter) -> list[str]:
    if not os.path.exists(counter):
        return []
    return [line.split()[0] for line in open(counter).read().splitlines()]


def _materialize(assets, prefix, instance, **kwargs):
    storage = StorageResource(
        prefix=prefix,
        stale_after_s=kwargs.pop("stale_after_s", 90.0),
        heartbeat_s=kwargs.pop("heartbeat_s", 30.0),
    )
    return dg.materialize(assets, instance=instance, resources={"storage": storage}, **kwargs)


def _latest(instance, asset):
    event = instance.get_latest_materialization_event(asset.key)
    mat = event.asset_materialization
    return mat.tags["dagster/data_version"], {k: v.value for k, v in mat.metadata.items()}


def _version(asset):
    return asset.code_versions_by_key[asset.key]


def _output(prefix, asset):
    return fs.join(
        fs.normalize(prefix), f"{'/'.join(asset.key.path)}-{asset.code_versions_by_key[asset.key]}"
    )


def test_rematerializing_unchanged_asset_does_no_work(prefix, tmp_path):
    counter = str(tmp_path / "counter")
    asset = chunked("t/a", counter=counter)
    with dg.instance_for_test() as instance:
        _materialize([asset], prefix, instance)
        assert _events(counter) == ["enter", "chunk0", "chunk1", "chunk2", "chunk3"]
        first_version, first_meta = _latest(instance, asset)
        assert first_meta["skipped"] is False

        _materialize([asset], prefix, instance)
        assert _events(counter) == ["enter", "chunk0", "chunk1", "chunk2", "chunk3"], (
            "compute was entered"
        )
        second_version, second_meta = _latest(instance, asset)
        assert second_version == first_version
        assert second_meta["skipped"] is True
        # the skipped materialization reports what the run that did the work reported
        assert second_meta["chunks_written"] == 4
        assert second_meta["note"] == first_meta["note"]
        assert second_meta["path"] == _output(prefix, asset)


def test_versioned_field_changes_version_path_and_marks_downstream_unsynced(prefix, tmp_path):
    a1 = chunked("t/a", seed=0)
    b1 = chunked("t/b", upstream=a1)
    assert _version(chunked("t/a", seed=0, delay_s=0.25, counter="x")) == _version(a1), (
        "unversioned fields must not change the version"
    )
    with dg.instance_for_test() as instance:
        _materialize([a1, b1], prefix, instance)
        assert get_stale_status_resolver(instance, [a1, b1]).get_status(b1.key) == StaleStatus.FRESH

        a2 = chunked("t/a", seed=1)
        b2 = chunked("t/b", upstream=a2)
        assert _version(a2) != _version(a1)
        assert _version(b2) != _version(b1), "a downstream version includes its inputs' versions"
        assert _output(prefix, a2) != _output(prefix, a1)
        resolver = get_stale_status_resolver(instance, [a2, b2])
        assert resolver.get_status(a2.key) == StaleStatus.STALE
        assert resolver.get_status(b2.key) == StaleStatus.STALE
        causes = [c.category.name for c in resolver.get_stale_causes(b2.key)]
        assert "CODE" in causes

        _materialize([a2, b2], prefix, instance)
        resolver = get_stale_status_resolver(instance, [a2, b2])
        assert resolver.get_status(b2.key) == StaleStatus.FRESH
        # both versions' outputs coexist, each still SUCCESS
        assert read_status(_output(prefix, a1)).status == StepStatus.SUCCESS
        assert fs.read_bytes(fs.join(_output(prefix, b2), "chunk-00000.bin")) == chunk_bytes(
            0, 0, 4096, chunk_bytes(1, 0, 4096)
        )


def test_force_reruns_from_run_config_and_from_run_tag(prefix, tmp_path):
    counter = str(tmp_path / "counter")
    asset = chunked("t/a", counter=counter, num_chunks=2)
    with dg.instance_for_test() as instance:
        _materialize([asset], prefix, instance)
        _materialize(
            [asset],
            prefix,
            instance,
            run_config={"ops": {asset.op.name: {"config": {"force": True}}}},
        )
        assert _events(counter).count("enter") == 2
        assert _events(counter).count("chunk0") == 2, "force must redo finished chunks too"
        _materialize([asset], prefix, instance, tags={"marin/force": "true"})
        assert _events(counter).count("enter") == 3
        assert _latest(instance, asset)[1]["skipped"] is False
        _materialize([asset], prefix, instance, tags={"marin/force": "yes"})
        assert _events(counter).count("enter") == 4
        _materialize([asset], prefix, instance, tags={"marin/force": "false"})
        assert _events(counter).count("enter") == 4  # skipped
        # a value that is neither fails the step, not skips it quietly
        with pytest.raises(ValueError, match=r"run tag marin/force='always': set it to true"):
            _materialize([asset], prefix, instance, tags={"marin/force": "always"})
        assert _events(counter).count("enter") == 4
        # ...and so does a misspelled tag, which was ignored: the run skipped every step
        with pytest.raises(
            ValueError, match=r"run tag marin/froce='true' .* did you mean marin/force\?"
        ):
            _materialize([asset], prefix, instance, tags={"marin/froce": "true"})
        assert _events(counter).count("enter") == 4


def test_downstream_of_unmaterialized_input_fails_naming_it(prefix, tmp_path):
    a = chunked("t/a")
    b = chunked("t/b", upstream=a)
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.Failure, match=r"input 'source' \(t/a\) is missing"):
            _materialize([a, b], prefix, instance, selection=[b])


def _start_runner(prefix, counter, home, delay, num_chunks=6):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.execution.chunked",
            "--prefix",
            prefix,
            "--counter",
            counter,
            "--delay",
            str(delay),
            "--num-chunks",
            str(num_chunks),
            "--heartbeat",
            "1",
            "--stale-after",
            "5",
        ],
        cwd=REPO,
        env=subprocess_env(DAGSTER_HOME=home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(predicate, timeout=120.0):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def test_sigkill_mid_write_then_rerun_gives_clean_bytes(process_prefix, dagster_home, tmp_path):
    prefix = process_prefix
    counter = str(tmp_path / "counter")
    # Each chunk sleeps halfway through its write: two chunks done, the kill lands inside the third.
    proc = _start_runner(prefix, counter, dagster_home, delay=0.5)
    _wait_for(lambda: _events(counter).count("enter") == 1 and len(_events(counter)) >= 3)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    asset = chunked("test/chunks", num_chunks=6)
    output = _output(prefix, asset)
    status = read_status(output)
    assert status is not None and status.status == StepStatus.RUNNING
    assert not fs.exists(fs.join(output, MANIFEST_FILE))
    done_before = [e for e in _events(counter) if e.startswith("chunk")]
    assert done_before == ["chunk0", "chunk1"]
    fsys, root = fs.url_to_fs(output)
    names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fsys.ls(root, detail=False)]
    assert "chunk-00002.bin" not in names, "a half-written chunk is visible under its name"
    if not prefix.startswith("gs://"):  # on object stores the partial bytes never left the machine
        assert any(n.startswith("chunk-00002.bin") and fs.is_temp_name(n) for n in names), names

    rerun = _start_runner(prefix, counter, dagster_home, delay=0.0)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1])["skipped"] is False
    redone = _events(counter)[len(done_before) + 1 :]
    assert redone[0] == "enter"
    assert not set(done_before) & set(redone), "finished chunks were written again"
    assert read_status(output).status == StepStatus.SUCCESS

    clean_prefix = prefix + "-clean"  # same kind of store: same checksums in the manifest
    with dg.instance_for_test() as instance:
        _materialize([asset], clean_prefix, instance)
    clean = _output(clean_prefix, asset)
    for i in range(6):
        name = f"chunk-{i:05d}.bin"
        assert fs.read_bytes(fs.join(output, name)) == fs.read_bytes(fs.join(clean, name))
    assert (
        fs.read_json(fs.join(output, MANIFEST_FILE))["files"].keys()
        == fs.read_json(fs.join(clean, MANIFEST_FILE))["files"].keys()
    )
    assert read_status(output).data_version == read_status(clean).data_version


def test_two_processes_at_once_exactly_one_does_the_work(process_prefix, dagster_home, tmp_path):
    counter = str(tmp_path / "counter")
    procs = [
        _start_runner(process_prefix, counter, dagster_home, delay=0.4, num_chunks=4)
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert _events(counter).count("enter") == 1
    assert sorted(r["skipped"] for r in results) == [False, True]
    assert results[0]["data_version"] == results[1]["data_version"]
    output = _output(process_prefix, chunked("test/chunks", num_chunks=4))
    assert read_status(output).status == StepStatus.SUCCESS
    for i in range(4):
        assert fs.read_bytes(fs.join(output, f"chunk-{i:05d}.bin")) == chunk_bytes(0, i, 4096)


def test_bad_step_config_names_the_field():
    with pytest.raises(pydantic.ValidationError, match="num_chunk"):
        chunked("t/x", num_chunk=3)
    with pytest.raises(pydantic.ValidationError, match="num_chunks"):
        chunked("t/x", num_chunks="3")


def test_bad_run_config_fails_before_any_work(prefix, tmp_path):
    counter = str(tmp_path / "counter")
    asset = chunked("t/x", counter=counter)
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError, match="forse"):
            _materialize(
                [asset],
                prefix,
                instance,
                run_config={"ops": {asset.op.name: {"config": {"forse": True}}}},
            )
        with pytest.raises(dg.DagsterInvalidConfigError, match="force"):
            _materialize(
                [asset],
                prefix,
                instance,
                run_config={"ops": {asset.op.name: {"config": {"force": "yes"}}}},
            )
    assert _events(counter) == []


def _messages(exc: BaseException | None) -> str:
    """The error and its causes, as the Dagster UI shows them."""
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__
    return "\n".join(out)


def test_unwritable_prefix_fails_before_any_work_naming_it(tmp_path):
    counter = str(tmp_path / "counter")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    asset = chunked("t/x", counter=counter)
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterResourceFunctionError) as raised:
            _materialize([asset], str(blocker / "data"), instance)
    assert f"storage prefix '{blocker}/data' is not writable" in _messages(raised.value)
    assert "MARIN_PREFIX" in _messages(raised.value)
    assert _events(counter) == []


def test_unreachable_bucket_fails_naming_it(gcs_emulator, tmp_path):
    counter = str(tmp_path / "counter")
    asset = chunked("t/x", counter=counter)
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterResourceFunctionError) as raised:
            _materialize([asset], "gs://no-such-bucket-x/data", instance)
    assert "storage prefix 'gs://no-such-bucket-x/data' is not writable" in _messages(raised.value)
    assert _events(counter) == []


def test_a_step_whose_inputs_changed_at_the_same_version_is_rebuilt(tmp_path):
    """What an output was built from is recorded with SUCCESS; other inputs rebuild it (an
    upstream rebuilt at its version with other data), the same inputs skip, and an output
    written before inputs were recorded is not rebuilt for that alone."""
    from marin_dagster.execution.status import StatusRecord, write_status
    from marin_dagster.execution.step import execute_step

    out = str(tmp_path / "step-aaaaaaaa")
    runs: list[str] = []

    def run(path: str) -> dict:
        runs.append(path)
        fs.write_text(fs.join(path, "x.txt"), f"run {len(runs)}")
        return {}

    assert not execute_step(out, "aaaaaaaa", run, inputs={"source": "d1"}).skipped
    assert read_status(out).inputs == {"source": "d1"}
    assert execute_step(out, "aaaaaaaa", run, inputs={"source": "d1"}).skipped
    assert not execute_step(out, "aaaaaaaa", run, inputs={"source": "d2"}).skipped
    assert len(runs) == 2 and read_status(out).inputs == {"source": "d2"}

    record = read_status(out)
    write_status(out, StatusRecord(StepStatus.SUCCESS, "aaaaaaaa", record.data_version))
    assert execute_step(out, "aaaaaaaa", run, inputs={"source": "d3"}).skipped
