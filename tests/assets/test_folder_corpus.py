"""`folder_corpus` over a folder that is missing or holds no matching file has nothing to
build (skipped, with what follows, naming why); files with no text fail at the source."""

from __future__ import annotations

import json
import logging
import os

import dagster as dg
import pytest

from assets import folder_corpus, watched_folder
from marin_dagster.execution.asset import step_for
from marin_dagster.execution.status import StepStatus, read_status
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource


def _materialize(folder: str, prefix: str, **config) -> tuple[dg.ExecuteInProcessResult, str]:
    inbox = watched_folder("raw/inbox", folder)
    return _materialize_assets(folder_corpus("raw/inbox_corpus", source=inbox, **config), prefix)


def _materialize_assets(
    corpus: dg.AssetsDefinition, prefix: str
) -> tuple[dg.ExecuteInProcessResult, str]:
    storage = StorageResource(prefix=prefix)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus], instance=instance, resources={"storage": storage}, raise_on_error=False
        )
    return result, storage.output_path("raw/inbox_corpus", corpus.code_versions_by_key[corpus.key])


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    failures = [e for e in result.all_events if e.is_step_failure]
    assert failures, "the step did not fail"
    return failures[0].step_failure_data.error.to_string()


def _skipped(folder: str, prefix: str, **config) -> str:
    """Materialize the folder's corpus and a step after it with nothing to build: both are
    skipped, the run succeeds, nothing is written; the warning saying why."""
    from assets import deduplicated

    inbox = watched_folder("raw/inbox", folder)
    corpus = folder_corpus("raw/inbox_corpus", source=inbox, **config)
    clean = deduplicated("dedup/inbox", source=corpus, mode="exact")
    storage = StorageResource(prefix=prefix)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus, clean],
            instance=instance,
            resources={"storage": storage, "zephyr": ZephyrResource(max_workers=1)},
        )
        assert result.success
        assert result.get_asset_materialization_events() == []
        skipped = [e for e in result.all_events if e.event_type_value == "STEP_SKIPPED"]
        assert [e.step_key for e in skipped] == [clean.op.name]
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if "nothing to build" in e.user_message
        ]
    for asset in (corpus, clean):
        output = storage.output_path(step_for(asset).name, asset.code_versions_by_key[asset.key])
        assert read_status(output) is None
    assert len(warnings) == 1
    return warnings[0]


def test_a_missing_folder_is_skipped_naming_it(tmp_path):
    """An inbox not made yet is nothing to build, not a failure: "Materialize all" builds
    the rest of the location."""
    missing = tmp_path / "no-such-inbox"
    warning = _skipped(str(missing), str(tmp_path / "data"))
    assert str(missing) in warning and "does not exist" in warning


@pytest.mark.parametrize("files, pattern", [({}, "*"), ({".hidden": "x", "a.md": "x"}, "*.txt")])
def test_a_folder_without_matching_files_is_skipped_naming_it(tmp_path, files, pattern):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name, text in files.items():
        (inbox / name).write_text(text)
    warning = _skipped(str(inbox), str(tmp_path / "data"), pattern=pattern)
    assert str(inbox) in warning and repr(pattern) in warning


def test_a_folder_with_files_still_succeeds(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.txt").write_text("some text")
    result, output = _materialize(str(inbox), str(tmp_path / "data"))
    assert result.success
    assert read_status(output).status == StepStatus.SUCCESS


def test_files_the_pattern_leaves_out_are_named(tmp_path):
    """The inbox reads *.jsonl: a .jsonl.gz, a .JSONL and an .ndjson dropped beside them were
    left out, and nothing said so."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"text": "one"}\n')
    for name in ("b.jsonl.gz", "c.JSONL", "d.ndjson"):
        (inbox / name).write_bytes(b"x")
    (inbox / ".hidden.jsonl").write_text("editor state")
    inbox_asset = watched_folder("raw/inbox", str(inbox))
    corpus = folder_corpus("raw/inbox_corpus", source=inbox_asset, pattern="*.jsonl")
    storage = StorageResource(prefix=str(tmp_path / "data"))
    with dg.instance_for_test() as instance:
        result = dg.materialize([corpus], instance=instance, resources={"storage": storage})
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.level == logging.WARNING and "do not match" in e.user_message
        ]
    assert warnings == [
        f"3 file(s) under {inbox} do not match pattern '*.jsonl' and were not read: "
        "b.jsonl.gz, c.JSONL, d.ndjson"
    ]
    meta = result.asset_materializations_for_node(corpus.op.name)[0].metadata
    assert meta["left_out_files"].value == ["b.jsonl.gz", "c.JSONL", "d.ndjson"]


@pytest.mark.parametrize("files", [{"empty.jsonl": b""}, {"a.txt": b"  \n", "b.jsonl": b"\n\n"}])
def test_files_without_text_fail_at_the_source_naming_them(tmp_path, files):
    """Not two steps later, as the tokenizer's 'no training text'."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name, data in files.items():
        (inbox / name).write_bytes(data)
    result, output = _materialize(str(inbox), str(tmp_path / "data"))
    assert not result.success
    message = _failure_message(result)
    assert f"the {len(files)} file(s) under {inbox} hold no text" in message
    assert all(name in message for name in files)
    assert read_status(output).status == StepStatus.FAILED


@pytest.mark.parametrize(
    "name, data, column",
    [
        ("a.txt", b"first line\nsecond \xff line\n", 7),
        ("a.txt", b"\xef\xbb\xbffirst\nsecond \xff line\n", 7),  # counted past the mark
        # a JSONL file is decoded a line at a time
        ("a.jsonl", b'{"text": "one"}\r\n{"text": "tw\xff"}\n', 12),
    ],
)
def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, name, data, column):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / name).write_bytes(data)
    result, _ = _materialize(str(inbox), str(tmp_path / "data"))
    message = _failure_message(result)
    assert f"{inbox / name}:2: byte {column} of the line is not UTF-8" in message


def test_a_compressed_file_is_named_as_such_not_as_not_utf8(tmp_path):
    """A .jsonl.gz dropped in the inbox (pattern="*") failed as "byte 1 of the line is not
    UTF-8: convert it", advice that fits a Latin-1 file."""
    import gzip

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "one"}\n'))
    result, _ = _materialize(str(inbox), str(tmp_path / "data"))
    message = _failure_message(result)
    assert f"{inbox / 'b.jsonl.gz'} is gz-compressed; folder_corpus reads plain text" in message
    assert "not UTF-8" not in message


def test_changed_files_rebuild_the_corpus_and_what_follows_without_the_sensor(
    tmp_path, monkeypatch
):
    """The corpus's version holds the folder's path, not its files: materialized by hand (or
    `python exp.py`) after a file was added, it and the dedup after it were skipped on the
    old files' outputs. A touched file with the same bytes still skips."""
    from assets import deduplicated

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"text": "first document"}\n')
    corpus = folder_corpus("raw/inbox_corpus", source=watched_folder("raw/inbox", str(inbox)))
    clean = deduplicated("dedup/inbox", source=corpus, mode="exact")
    storage = StorageResource(prefix=str(tmp_path / "data"))
    resources = {"storage": storage, "zephyr": ZephyrResource(max_workers=1)}
    dedup_output = storage.output_path("dedup/inbox", clean.code_versions_by_key[clean.key])

    def build() -> list[bool]:
        with dg.instance_for_test() as instance:
            result = dg.materialize([corpus, clean], instance=instance, resources=resources)
        return [
            e.materialization.metadata["skipped"].value
            for e in result.get_asset_materialization_events()
        ]

    def kept() -> int:
        with open(f"{dedup_output}/documents/part-00000.jsonl.gz", "rb") as f:
            import gzip

            return len(gzip.decompress(f.read()).splitlines())

    def states() -> dict[str, str]:  # as `marin status` shows them
        from marin_dagster.cli import status_rows
        from marin_dagster.execution.asset import upstream_closure

        _, rows = status_rows(storage.root, steps=upstream_closure([clean]))
        return {row[0]: row[2] for row in rows}

    assert build() == [False, False] and kept() == 1
    assert build() == [True, True]
    (inbox / "b.jsonl").write_text('{"text": "second document"}\n')
    # the corpus will be rebuilt; the dedup after it, if the corpus comes out different (it
    # showed SUCCESS, as if the new file changed nothing after the corpus)
    assert states() == {
        "raw/inbox": "watched",
        "raw/inbox_corpus": "outdated",
        "dedup/inbox": "upstream outdated",
    }
    assert build() == [False, False] and kept() == 2
    assert set(states().values()) == {"watched", "SUCCESS"}, states()
    (inbox / "a.jsonl").touch()
    assert build() == [True, True] and kept() == 2

    # Emptied: `marin status` said "outdated, materializing rebuilds it", and the run then
    # built nothing. Both now say the same: nothing to build, the output before kept.
    for name in ("a.jsonl", "b.jsonl"):
        (inbox / name).unlink()
    assert states()["raw/inbox_corpus"] == "nothing to build"
    with dg.instance_for_test() as instance:
        result = dg.materialize([corpus, clean], instance=instance, resources=resources)
        assert result.get_asset_materialization_events() == []
        (warning,) = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if "nothing to build" in e.user_message
        ]
    corpus_output = storage.output_path("raw/inbox_corpus", corpus.code_versions_by_key[corpus.key])
    assert f"the output built before stays as it was at {corpus_output}" in warning
    assert kept() == 2


def test_editor_backups_are_not_read_as_documents(tmp_path):
    """The sensor never sees `name~` files (datasets/watch.py), so the corpus leaves them out
    too: an editor's backup of a file was read as a second copy of it."""
    import gzip
    import json

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "notes.txt").write_text("the notes as they are now")
    (inbox / "notes.txt~").write_text("the notes as they were")
    result, output = _materialize(str(inbox), str(tmp_path / "data"))
    assert result.success
    with open(f"{output}/part-00000.jsonl.gz", "rb") as f:
        ids = [json.loads(line)["id"] for line in gzip.decompress(f.read()).splitlines()]
    assert ids == ["notes.txt"]


def test_a_relative_folder_keeps_its_versions_wherever_the_checkout_lies(
    tmp_path, monkeypatch
) -> None:
    """The same experiment in two clones: the folder as written is in the versions, the
    folder it resolves to is not (it used to be, so a moved checkout rebuilt everything below
    its inbox). Each clone still reads its own files, and the documents name the folder as
    written, as the version does."""
    import gzip

    from assets import deduplicated

    outputs = []
    for clone in ("one", "two"):
        root = tmp_path / clone
        (root / "data" / "inbox").mkdir(parents=True)
        (root / "data" / "inbox" / "a.jsonl").write_text(f'{{"text": "a document in {clone}"}}\n')
        monkeypatch.chdir(root)
        inbox = watched_folder("raw/inbox", "./data/inbox")
        corpus = folder_corpus("raw/inbox_corpus", source=inbox)
        clean = deduplicated("dedup/inbox", source=corpus, mode="exact")
        assert step_for(inbox).config.path == str(root / "data" / "inbox")
        versions = [step_for(a).version for a in (inbox, corpus, clean)]
        monkeypatch.chdir(tmp_path)  # the run starts elsewhere: the path was resolved at load
        result, output = _materialize_assets(corpus, str(root / "data"))
        assert result.success
        with open(f"{output}/part-00000.jsonl.gz", "rb") as f:
            (doc,) = [json.loads(line) for line in gzip.decompress(f.read()).splitlines()]
        assert doc == {
            "id": "a.jsonl:1",
            "text": f"a document in {clone}",
            "source": "./data/inbox",
        }
        outputs.append(versions)
    assert outputs[0] == outputs[1]
    # a different folder is a different step
    other = watched_folder("raw/inbox", "./data/other")
    assert step_for(other).version != outputs[0][0]


def test_a_bad_line_in_the_last_file_leaves_no_shard(tmp_path):
    """Shards are written while the files are read; one that fails at the end of the folder
    leaves no shard, finished or not, and the status FAILED."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(100)))
    (inbox / "b.jsonl").write_text('{"text": "fine"}\n\n{"txt": "no text field"}\n')
    result, output = _materialize(str(inbox), str(tmp_path / "data"), num_shards=3)
    message = _failure_message(result)
    assert f"{inbox / 'b.jsonl'}:3: no string field 'text'" in message
    assert read_status(output).status == StepStatus.FAILED
    assert [p for p in os.listdir(output) if "part-" in p] == []


def test_a_large_jsonl_file_is_never_held_whole(tmp_path):
    """A dump of gigabytes dropped in the inbox used to be read whole, decoded whole and held
    as documents before any shard was written: three copies of it in memory. Here a 32 MB
    file is built while Python's allocations stay under a fifth of it (tracemalloc counts
    every allocation Python makes, Dagster's included)."""
    import gzip
    import tracemalloc

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    line = json.dumps({"text": "word " * 200}) + "\n"
    count = 32_000_000 // len(line)
    with open(inbox / "dump.jsonl", "w") as f:
        f.writelines(line for _ in range(count))
    tracemalloc.start()
    try:
        result, output = _materialize(str(inbox), str(tmp_path / "data"), num_shards=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.success
    assert peak < 6_400_000, f"peak {peak / 1e6:.1f} MB"
    lines = 0
    for index in range(2):
        with gzip.open(os.path.join(output, f"part-{index:05d}.jsonl.gz")) as f:
            lines += sum(1 for _ in f)
    assert lines == count


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Editors on Windows start UTF-8 files with one: a JSONL file's first line failed as
    broken, and a text file's document began with U+FEFF."""
    import gzip

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')
    (inbox / "b.txt").write_bytes(b"\xef\xbb\xbfa text file")
    result, output = _materialize(str(inbox), str(tmp_path / "data"))
    assert result.success
    with gzip.open(os.path.join(output, "part-00000.jsonl.gz")) as f:
        texts = [json.loads(line)["text"] for line in f]
    assert texts == ["first", "second", "a text file"]


def test_the_dry_run_watches_the_folder_and_skips_what_has_nothing_to_build(
    tmp_path, monkeypatch, capsys
):
    """It listed the watched folder as `run` at an output path nothing writes, and an empty
    inbox's corpus as `run` (the run then built nothing)."""
    from assets import deduplicated
    from marin_dagster.marin import StepRunner

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    corpus = folder_corpus("raw/inbox_corpus", source=watched_folder("raw/inbox", str(inbox)))
    clean = deduplicated("dedup/inbox", source=corpus, mode="exact")
    StepRunner(prefix=str(tmp_path / "data")).run([clean], dry_run=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"watch  raw/inbox (watched_folder) -> {inbox}"
    assert lines[1].startswith("skip   raw/inbox_corpus-")
    assert f"(folder_corpus, missing; nothing to build: no files under {inbox}" in lines[1]
    assert "(deduplicated, missing; after raw/inbox_corpus, skipped)" in lines[2]
    assert len(lines) == 3


def test_a_file_of_duplicates_alone_rebuilds_the_dedup_not_what_reads_it(tmp_path):
    """The dedup's data version digested its attributes and counts too, so a dropped file
    holding only copies of documents already there retrained the tokenizer on the same
    documents. It now digests documents/, what the steps after it read."""
    from assets import deduplicated, tokenizer

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    texts = [f"document number {i} with some words in it " * 3 for i in range(30)]
    (inbox / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    corpus = folder_corpus("raw/c", source=watched_folder("raw/w", str(inbox)))
    clean = deduplicated("dedup/c", source=corpus, mode="exact")
    tok = tokenizer("tokenizers/c", source=clean, vocab_size=300)
    resources = {
        "storage": StorageResource(prefix=str(tmp_path / "data")),
        "zephyr": ZephyrResource(max_workers=1),
    }

    def skipped() -> list[bool]:
        with dg.instance_for_test() as instance:
            result = dg.materialize([corpus, clean, tok], instance=instance, resources=resources)
        return [
            e.materialization.metadata["skipped"].value
            for e in result.get_asset_materialization_events()
        ]

    assert skipped() == [False, False, False]
    (inbox / "z.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n")
    assert skipped() == [False, False, True]
    (inbox / "y.jsonl").write_text(json.dumps({"text": "a new document of its own"}) + "\n")
    assert skipped() == [False, False, False]
