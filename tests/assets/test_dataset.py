"""dataset(...) and as_dataset(...) as assets with a real Dagster instance: local, gs://
(the emulator), http and stand-in hub sources; versions downstream; bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import dagster as dg
import pytest

from assets import as_dataset, dataset, deduplicated, tokenized, tokenizer
from marin_dagster import fs
from marin_dagster.datasets.files import dataset_files
from marin_dagster.datasets.sources import SourceError
from marin_dagster.execution.asset import step_for
from marin_dagster.execution.origins import read_origins
from marin_dagster.execution.status import StepStatus, read_status
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource
from tests.conftest import run_warnings
from tests.hub import serve_files, stand_in_hub

TEXTS = [f"line {i}: all the world's a stage" for i in range(6)]


def _jsonl(texts: list[str], key: str = "text") -> bytes:
    return "".join(json.dumps({"id": f"d{i}", key: t}) + "\n" for i, t in enumerate(texts)).encode()


def _meta(result: dg.ExecuteInProcessResult, asset: dg.AssetsDefinition) -> dict:
    return {
        k: v.value
        for k, v in result.asset_materializations_for_node(asset.op.name)[0].metadata.items()
    }


def _version(asset: dg.AssetsDefinition) -> str:
    return asset.code_versions_by_key[asset.key]


def _resources(prefix: str) -> dict:
    return {"storage": StorageResource(prefix=prefix), "zephyr": ZephyrResource(max_workers=1)}


def _failing(asset: dg.AssetsDefinition, prefix: str) -> tuple[dg.ExecuteInProcessResult, str]:
    """Materialize `asset`, which must fail: the result, and the output its status is in."""
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset], instance=instance, resources=_resources(prefix), raise_on_error=False
        )
    assert not result.success
    return result, StorageResource(prefix=prefix).output_path(step_for(asset).name, _version(asset))


def test_local_dataset_feeds_dedup_and_a_changed_file_changes_both_versions(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    # d0..d5 plus an exact copy of two of them in the second file
    (src / "a.jsonl").write_bytes(_jsonl(TEXTS))
    (src / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(TEXTS[:2]).replace(b'"d', b'"e')))
    resources = _resources(str(tmp_path / "data"))
    raw = dataset("raw/notes", str(src))
    clean = deduplicated("dedup/notes", source=raw, mode="exact")
    with dg.instance_for_test() as instance:
        result = dg.materialize([raw, clean], instance=instance, resources=resources)
        meta = _meta(result, raw)
        assert meta["skipped"] is False
        assert meta["files"] == 2 and meta["documents"] == 8
        # its tasks copy files; no Zephyr writer, so no "records_written: 0" beside them
        assert meta["zephyr/shards"] == 2 and "zephyr/records_written" not in meta
        assert meta["bytes"] == sum(p.stat().st_size for p in src.iterdir())
        assert "| a.jsonl |" in meta["preview"] and "all the world" in meta["preview"]
        assert meta["source"] == str(src)
        output = meta["path"]
        assert read_status(output).status == StepStatus.SUCCESS
        assert [os.path.basename(p) for p in dataset_files(output)] == ["a.jsonl", "b.jsonl.gz"]
        assert _meta(result, clean)["document_duplicates"] == 2

        # nothing changed: the same versions when the experiment is loaded again, and a skip
        raw_again = dataset("raw/notes", str(src))
        clean_again = deduplicated("dedup/notes", source=raw_again, mode="exact")
        assert _version(raw_again) == _version(raw)
        assert _version(clean_again) == _version(clean)
        again = dg.materialize([raw_again, clean_again], instance=instance, resources=resources)
        assert _meta(again, raw_again)["skipped"] is True
        assert _meta(again, clean_again)["skipped"] is True

        # one changed file: a new dataset version, hence a new dedup version, and real work
        (src / "a.jsonl").write_bytes(_jsonl(TEXTS + ["a new line"]))
        raw_new = dataset("raw/notes", str(src))
        clean_new = deduplicated("dedup/notes", source=raw_new, mode="exact")
        assert _version(raw_new) != _version(raw)
        assert _version(clean_new) != _version(clean)
        tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300)
        tok_new = tokenizer("tokenizers/notes", source=raw_new, vocab_size=300)
        tokens = tokenized("tokenized/notes", source=raw, tokenizer=tok)
        tokens_new = tokenized("tokenized/notes", source=raw_new, tokenizer=tok_new)
        assert _version(tokens_new) != _version(tokens)
        third = dg.materialize([raw_new, clean_new], instance=instance, resources=resources)
        assert _meta(third, raw_new)["skipped"] is False
        assert _meta(third, raw_new)["documents"] == 9
        assert _meta(third, clean_new)["document_total"] == 9
        assert read_status(output).status == StepStatus.SUCCESS  # the old version stays


def test_a_relative_or_home_source_has_one_version_wherever_it_is_resolved(tmp_path, monkeypatch):
    """The same files under the same relative (or `~`) source, resolved in another clone,
    working folder or account, are the same dataset: the version holds the source as given
    and the files' content, not the absolute path this machine resolved it to. The run reads
    the path resolved at load time, wherever it starts."""
    versions, outputs = [], []
    for where in ("clone-a", "clone-b"):
        (tmp_path / where / "corpus").mkdir(parents=True)
        (tmp_path / where / "corpus" / "a.jsonl").write_bytes(_jsonl(TEXTS))
        monkeypatch.chdir(tmp_path / where)
        monkeypatch.setenv("HOME", str(tmp_path / where))
        for source in ("corpus", "./corpus", "~/corpus"):
            raw = dataset("raw/notes", source)
            versions.append((source, _version(raw)))
        monkeypatch.chdir(tmp_path)  # the run starts elsewhere: it reads what was resolved
        prefix = str(tmp_path / f"data-{where}")
        with dg.instance_for_test() as instance:
            result = dg.materialize([raw], instance=instance, resources=_resources(prefix))
        outputs.append(_meta(result, raw)["path"])
    assert versions[:3] == versions[3:], versions
    assert [os.path.relpath(p, tmp_path) for p in outputs] == [
        f"data-{w}/raw/notes-{versions[2][1]}" for w in ("clone-a", "clone-b")
    ]
    assert [fs.read_bytes(dataset_files(p)[0]) for p in outputs] == [_jsonl(TEXTS)] * 2
    # other files under the same source are another dataset
    (tmp_path / "clone-b" / "corpus" / "a.jsonl").write_bytes(_jsonl(TEXTS[:3]))
    monkeypatch.chdir(tmp_path / "clone-b")
    assert _version(dataset("raw/notes", "corpus")) != versions[0][1]


def test_files_a_folder_source_leaves_out_are_named_in_the_run(tmp_path):
    """A file whose extension names no format is not read: the run says so, not silence."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_bytes(_jsonl(TEXTS))
    (src / "more notes.txt").write_text("a note the user meant to include\n")
    raw = dataset("raw/notes", str(src))
    with dg.instance_for_test() as instance:
        result = dg.materialize([raw], instance=instance, resources=_resources(str(tmp_path)))
        warnings = run_warnings(instance, result.run_id)
    assert _meta(result, raw)["left_out_files"] == ["more notes.txt"]
    assert any("1 file(s) left out" in w and "more notes.txt" in w for w in warnings), warnings


def test_hub_dataset_asset_records_the_commit_and_skips_when_unchanged(tmp_path):
    files = {
        "data/train-00000-of-00001.jsonl": _jsonl(TEXTS),
        "data/test-00000-of-00001.jsonl": _jsonl(TEXTS[:1]),
        "README.md": b"# tiny\n",
    }
    with stand_in_hub(datasets={"someone/tiny": files}) as hub:
        raw = as_dataset("someone/tiny", split="train")
        assert step_for(raw).name == "raw/someone/tiny/train"
        assert as_dataset(raw) is raw
        resources = _resources(str(tmp_path / "data"))
        with dg.instance_for_test() as instance:
            result = dg.materialize([raw], instance=instance, resources=resources)
            meta = _meta(result, raw)
            commit = hub.add("someone/tiny", {**files, "README.md": b"# tiny, edited\n"})
            assert meta["revision"] != commit and len(meta["revision"]) == 40
            assert meta["documents"] == 6 and meta["files"] == 1
            assert [os.path.relpath(p, meta["path"]) for p in dataset_files(meta["path"])] == [
                "data/train-00000-of-00001.jsonl"
            ]
            assert read_origins(meta["path"]) == {
                "data/train-00000-of-00001.jsonl": f"hf://datasets/someone/tiny@{meta['revision']}"
                "/data/train-00000-of-00001.jsonl"
            }
            # a commit that leaves the train files as they were: same version, skipped
            again_asset = as_dataset("someone/tiny", split="train")
            assert _version(again_asset) == _version(raw)
            again = dg.materialize([again_asset], instance=instance, resources=resources)
            assert _meta(again, again_asset)["skipped"] is True
            # main moves on to new data after loading: a run fetches the commit it was
            # loaded at, the content its version was computed from
            hub.add("someone/tiny", {**files, "data/train-00000-of-00001.jsonl": _jsonl(["x"])})
            elsewhere = _resources(str(tmp_path / "elsewhere"))
            pinned = _meta(
                dg.materialize([again_asset], instance=instance, resources=elsewhere),
                again_asset,
            )
            assert pinned["skipped"] is False
            assert pinned["revision"] == commit and pinned["documents"] == 6
            assert _version(as_dataset("someone/tiny", split="train")) != _version(raw)


def test_gs_dataset_through_the_emulator_into_a_gs_prefix(gcs_prefix):
    import zstandard

    fs.write_bytes(f"{gcs_prefix}/src/web/0.jsonl.zst", zstandard.compress(_jsonl(TEXTS)))
    fs.write_bytes(f"{gcs_prefix}/src/web/1.jsonl.zst", zstandard.compress(_jsonl(TEXTS[:3])))
    source = f"{gcs_prefix}/src/web/*.jsonl.zst"
    raw = as_dataset(source)
    assert step_for(raw).name.startswith("raw/marin-test/")
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw], instance=instance, resources=_resources(f"{gcs_prefix}/data")
        )
    meta = _meta(result, raw)
    assert meta["path"].startswith("gs://") and meta["documents"] == 9
    assert dataset_files(meta["path"]) == [
        f"{meta['path']}/0.jsonl.zst",
        f"{meta['path']}/1.jsonl.zst",
    ]
    assert read_status(meta["path"]).status == StepStatus.SUCCESS
    assert fs.read_bytes(f"{meta['path']}/1.jsonl.zst") == zstandard.compress(_jsonl(TEXTS[:3]))
    assert read_origins(meta["path"]) == {
        "0.jsonl.zst": f"{gcs_prefix}/src/web/0.jsonl.zst",
        "1.jsonl.zst": f"{gcs_prefix}/src/web/1.jsonl.zst",
    }


def test_http_dataset_asset(tmp_path):
    with serve_files({"dl/corpus.jsonl.gz": gzip.compress(_jsonl(TEXTS))}) as server:
        raw = dataset("raw/web", server.url("dl/corpus.jsonl.gz"))
        with dg.instance_for_test() as instance:
            result = dg.materialize([raw], instance=instance, resources=_resources(str(tmp_path)))
        assert _meta(result, raw)["documents"] == 6


def test_bad_sources_fail_when_the_experiment_is_loaded(tmp_path):
    with stand_in_hub(datasets={"someone/tiny": {"train.jsonl": _jsonl(TEXTS)}}):
        with pytest.raises(
            SourceError, match=r"^dataset\('raw/x'\): dataset source 'someone/nothing': no dataset"
        ):
            dataset("raw/x", "someone/nothing")
        with pytest.raises(SourceError, match=r"revision 'nope' does not exist"):
            dataset("raw/x", "someone/tiny", revision="nope")
    with serve_files({}) as server:
        with pytest.raises(SourceError, match=r"HTTP 404"):
            dataset("raw/x", server.url("gone.jsonl"))
    with pytest.raises(SourceError, match=r"unknown format 'txt'"):
        dataset("raw/x", str(tmp_path), format="txt")
    with pytest.raises(SourceError, match=r"the source is empty"):
        dataset("raw/x", str(tmp_path))
    with pytest.raises(ValueError, match=r"asset name '\.\./x' is not allowed"):
        dataset("../x", str(tmp_path))


def test_a_missing_text_field_fails_the_run_before_success(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_bytes(_jsonl(TEXTS, key="body"))
    raw = dataset("raw/bodies", str(src))
    result, output = _failing(raw, str(tmp_path / "data"))
    error = result.get_step_failure_events()[0].step_failure_data.error
    record = read_status(output)
    assert record.status == StepStatus.FAILED
    for failure in (error.cause.message, record.error):
        # the user's file, not the dataset's copy of it: that is the file to fix
        assert f"dataset source '{src}'" in failure and f"line 1 of {src} " in failure
        assert output not in failure
        assert "no field 'text'" in failure and "['body', 'id']" in failure
        assert "text_key=" in failure
    # the same source with its text field named: another config, the same bytes, SUCCESS
    fixed = dataset("raw/bodies", str(src), text_key="body")
    with dg.instance_for_test() as instance:
        ok = dg.materialize(
            [fixed], instance=instance, resources=_resources(str(tmp_path / "data"))
        )
    assert _meta(ok, fixed)["documents"] == 6


def test_a_source_changed_after_loading_is_not_written_under_the_old_version(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_bytes(_jsonl(TEXTS))
    raw = dataset("raw/a", str(src))
    src.write_bytes(_jsonl(TEXTS[:2]))
    _, output = _failing(raw, str(tmp_path / "data"))
    record = read_status(output)
    assert record.status == StepStatus.FAILED
    assert "changed since this code location was loaded" in record.error
    assert "reload" in record.error
    assert not os.path.exists(os.path.join(output, "a.jsonl"))


def test_as_dataset_names(tmp_path):
    from assets.dataset import dataset_name

    assert dataset_name("roneneldan/TinyStories") == "raw/roneneldan/TinyStories"
    assert dataset_name("allenai/c4", subset="en", split="train") == "raw/allenai/c4/en/train"
    pinned = dataset_name("allenai/c4", revision="abc")
    assert pinned.startswith("raw/allenai/c4-") and pinned != dataset_name("allenai/c4")
    a = dataset_name("gs://bucket/web crawl/*.jsonl.zst")
    b = dataset_name("gs://bucket/web crawl/*.parquet")
    assert a.startswith("raw/bucket/web_crawl-") and a != b
    assert dataset_name(str(tmp_path / "corpus")) == "raw/corpus"


def test_a_relative_glob_is_named_the_same_in_any_working_folder(tmp_path, monkeypatch):
    """as_dataset's name is part of the output's path: a relative glob's must not follow the
    working folder it was resolved in (another clone, a cluster's checkout)."""
    from assets.dataset import dataset_name

    names = []
    for where in ("clone-a", "clone-b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        monkeypatch.setenv("HOME", str(tmp_path / where))
        names.append([dataset_name("corpus/*.jsonl"), dataset_name("~/corpus/*.jsonl")])
    assert names[0] == names[1]
    assert names[0][0].startswith("raw/corpus-") and names[0][0] != names[0][1]
    # an absolute glob keeps the name it had
    glob = str(tmp_path / "corpus" / "*.jsonl")
    digest = hashlib.sha256(glob.encode()).hexdigest()[:6]
    assert dataset_name(glob) == f"raw/corpus-{digest}"
    with pytest.raises(TypeError, match="an asset or a string"):
        as_dataset(42)  # type: ignore[arg-type]


def test_a_script_runs_summary_names_the_original_of_a_copy_dedup_failed_on(tmp_path):
    """Dedup reads the copy through Zephyr, which wraps the error: the note naming the
    original went on the wrapper, and the script run's summary, showing the error's first
    line, named only the copy, which users then edited."""
    from assets import Experiment
    from assets.experiment import StepsFailedError

    src = tmp_path / "corpus"
    src.mkdir()
    records = [{"id": i, "text": f"doc {i}"} for i in range(150)] + [{"id": 150, "body": "x"}]
    (src / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    prefix = str(tmp_path / "data")
    raw = dataset("raw/late", str(src))
    dedup = deduplicated("dedup/late", source=raw, mode="exact")
    copy = os.path.join(
        StorageResource(prefix=prefix).output_path("raw/late", _version(raw)), "l.jsonl"
    )
    with dg.instance_for_test() as instance, pytest.raises(StepsFailedError) as err:
        Experiment("late", leaves=[dedup]).materialize(
            resources=_resources(prefix), instance=instance
        )
    message = str(err.value)
    assert f"{copy}: line 151: record 150 has no 'text' field" in message, message
    assert f"{copy} is raw/late's copy of {src / 'l.jsonl'}: a fix to the file belongs there" in (
        message
    )


def test_a_broken_line_in_a_fetched_file_names_the_original_to_fix(tmp_path):
    """The tokenizer meets a broken line in the dataset's copy of the user's file: its error
    names the copy and the line, and a note names the original, which is what to fix. After
    fixing the original, the dataset gets a new version and the rerun goes through."""
    src = tmp_path / "corpus"
    src.mkdir()
    lines = _jsonl(TEXTS * 30).splitlines(keepends=True)  # 180 records
    broken = b'{"id": "x", "text": "never closed\n'
    # past the 100 records the dataset step checks, so the tokenizer is the one to meet it
    (src / "docs.jsonl").write_bytes(b"".join(lines[:150] + [broken] + lines[150:]))
    prefix = str(tmp_path / "data")
    raw = dataset("raw/notes", str(src))
    tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300)
    copy = os.path.join(
        StorageResource(prefix=prefix).output_path("raw/notes", _version(raw)), "docs.jsonl"
    )
    note = f"{copy} is raw/notes's copy of {src / 'docs.jsonl'}: a fix to the file belongs there"
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok], instance=instance, resources=_resources(prefix), raise_on_error=False
        )
        assert not result.success
        error = result.get_step_failure_events()[0].step_failure_data.error
        message = error.cause.message if error.cause else error.message
        record = read_status(
            StorageResource(prefix=prefix).output_path("tokenizers/notes", _version(tok))
        )
        for failure in (message, record.error):
            assert f"{copy}: line 151: record 150: " in failure
            assert note in failure and "new version" in failure
        assert read_status(os.path.dirname(copy)).status == StepStatus.SUCCESS

        # or, as the error offers, skip such records and count them
        skipping = tokenizer("tokenizers/notes", source=raw, vocab_size=300, skip_bad_records=True)
        assert _version(skipping) != _version(tok)
        skipped = dg.materialize([raw, skipping], instance=instance, resources=_resources(prefix))
        assert _meta(skipped, skipping)["bad_records"] == 1

        # the original fixed: a new dataset version, fetched, and the tokenizer trains on it
        (src / "docs.jsonl").write_bytes(b"".join(lines))
        raw_fixed = dataset("raw/notes", str(src))
        tok_fixed = tokenizer("tokenizers/notes", source=raw_fixed, vocab_size=300)
        assert _version(raw_fixed) != _version(raw)
        ok = dg.materialize([raw_fixed, tok_fixed], instance=instance, resources=_resources(prefix))
        assert _meta(ok, raw_fixed)["documents"] == 180
        assert _meta(ok, tok_fixed)["skipped"] is False


def test_a_broken_line_the_dataset_step_meets_is_a_warning_naming_the_users_file(tmp_path):
    """The dataset step copies the file as it is and warns of the broken line it checked,
    naming the user's file: the tokenizer after it skips the line when asked to, in the
    same run. A file of more broken lines than good fails, naming the user's file too."""
    src = tmp_path / "notes.jsonl"
    lines = _jsonl(TEXTS).splitlines(keepends=True)
    src.write_bytes(b"".join(lines[:2] + [b'{"id": "x", "text": "tab\there"}\n'] + lines[2:]))
    prefix = str(tmp_path / "data")
    raw = dataset("raw/notes", str(src))
    tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300, skip_bad_records=True)
    line = f"{src}: line 3: invalid JSON (Invalid control character at column 25)"
    with dg.instance_for_test() as instance:
        result = dg.materialize([raw, tok], instance=instance, resources=_resources(prefix))
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.step_key == raw.op.name and "broken line" in e.user_message
        ]
    assert len(warnings) == 1 and line in warnings[0] and "skip_bad_records=True" in warnings[0]
    meta = _meta(result, raw)
    assert meta["broken_lines_sampled"] == 1 and meta["broken_lines"][0].startswith(line)
    assert meta["documents"] == len(TEXTS) + 1  # lines, broken or not: the copy is whole
    assert _meta(result, tok)["bad_records"] == 1

    src.write_bytes(b"".join(lines[:1] + [b"{\n", b"}\n"]))
    _, output = _failing(dataset("raw/notes", str(src)), prefix)
    failure = read_status(output).error
    assert f"{src}: line 2: invalid JSON" in failure and output not in failure


@pytest.mark.parametrize(
    "validation, empty, says",
    [
        # none of six documents falls in the held-out 5%
        (0.05, "validation_documents", ["validation split is empty", "no document of 6", "evals="]),
        # 0.99 holds out every one of them
        (0.99, "train_documents", ["the train split is empty: all 6 documents"]),
    ],
)
def test_an_empty_split_is_reported_when_tokenizing(tmp_path, validation, empty, says):
    """The tokenize step says a split is empty, with what to do, instead of training failing
    on it later."""
    src = tmp_path / "notes.jsonl"
    src.write_bytes(_jsonl(TEXTS))
    raw = dataset("raw/notes", str(src))
    tok = tokenizer("tokenizers/notes", source=raw, vocab_size=300)
    ds = tokenized("tokenized/notes", source=raw, tokenizer=tok, validation=validation)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok, ds], instance=instance, resources=_resources(str(tmp_path / "data"))
        )
        assert _meta(result, ds)[empty] == 0
        warnings = [w for w in run_warnings(instance, result.run_id, ds.op.name) if says[0] in w]
    assert len(warnings) == 1 and all(s in warnings[0] for s in says)
    assert "validation=" in warnings[0]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv"])
def test_parquet_and_csv_datasets_go_through_dedup_and_tokenize(tmp_path, fmt):
    """Every format `dataset` fetches is one the steps after it read (a .tsv was refused)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS * 2)])
    src = tmp_path / f"notes.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, str(src))
    else:
        options = pacsv.WriteOptions(delimiter="\t" if fmt == "tsv" else ",")
        pacsv.write_csv(table, str(src), write_options=options)
    raw = dataset("raw/notes", str(src))
    clean = deduplicated("dedup/notes", source=raw, mode="exact")
    tok = tokenizer("tokenizers/notes", source=clean, vocab_size=300)
    ds = tokenized("tokenized/notes", source=clean, tokenizer=tok)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, clean, tok, ds], instance=instance, resources=_resources(str(tmp_path / "data"))
        )
    assert _meta(result, clean)["document_duplicates"] == len(TEXTS)
    (kept,) = dataset_files(_meta(result, clean)["path"])
    assert kept.endswith(f"documents/notes.{fmt}")
    assert _meta(result, ds)["documents"] == len(TEXTS)


def test_the_steps_after_a_dataset_read_its_text_field(tmp_path):
    """`dataset(..., text_key="body")` then `deduplicated`, `tokenizer` and `tokenized` without
    one: each used "text" and the dedup failed on a correct file, its message sending the user
    to fix the source. They now take the field from the records' own step."""
    src = tmp_path / "posts.jsonl"
    src.write_bytes(_jsonl([*TEXTS, TEXTS[0]], key="body"))
    raw = dataset("raw/posts", str(src), text_key="body")
    clean = deduplicated("dedup/posts", source=raw, mode="exact")
    tok = tokenizer("tokenizers/posts", source=clean, vocab_size=300)
    tokens = tokenized("tokenized/posts", source=clean, tokenizer=tok)
    assert [step_for(a).config.text_key for a in (clean, tok, tokens)] == ["body"] * 3
    # given, a field is taken as given
    assert step_for(deduplicated("dedup/p2", source=raw, text_key="text")).config.text_key == (
        "text"
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, clean, tok, tokens], instance=instance, resources=_resources(str(tmp_path / "d"))
        )
    assert result.success
    assert _meta(result, clean)["document_duplicates"] == 1
