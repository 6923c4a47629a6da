"""Dataset sources (marin_dagster/datasets/sources.py): local, gs:// (the emulator), http and
a stand-in Hugging Face Hub; formats, versions, resumed and verified downloads, bad input."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster.datasets.files import dataset_files
from marin_dagster.datasets.sources import (
    PARTIAL_MARK,
    SourceError,
    check_text_field,
    count_records,
    fetch,
    format_of,
    parse_source,
    resolve,
)
from tests.conftest import REPO, subprocess_env
from tests.hub import hub_fixture, serve_files, stand_in_hub  # noqa: F401 (the hub fixture)


def _jsonl(texts: list[str], key: str = "text") -> bytes:
    return "".join(json.dumps({"id": i, key: t}) + "\n" for i, t in enumerate(texts)).encode()


def _parquet(texts: list[str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), buf)
    return buf.getvalue()


def _csv(texts: list[str]) -> bytes:
    buf = io.BytesIO()
    pacsv.write_csv(pa.table({"id": list(range(len(texts))), "text": texts}), buf)
    return buf.getvalue()


TEXTS = [f"document {i}: to be, or not to be" for i in range(7)]


def _random_jsonl(n_bytes: int, seed: int = 0) -> bytes:
    """Incompressible JSON lines of about n_bytes (random hex), so transfers take many chunks."""
    import random

    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_bytes:
        line = json.dumps({"text": f"{rng.getrandbits(4000):x}"}) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def _fetch_all(source: str, out: str, **kw) -> tuple[list[str], object]:
    resolved = resolve(parse_source(source, **kw))
    result = fetch(resolved, out)
    return result.files, resolved


# -- local --------------------------------------------------------------------


def test_a_csv_of_one_line_is_named_not_read_as_no_records(tmp_path):
    """A CSV with no header line: its one row became the header, and the file gave no
    records, with no word."""
    path = tmp_path / "nohdr.csv"
    path.write_text("5,no header row\n")
    with pytest.raises(SourceError) as err:
        check_text_field([str(path)], "text", source=str(path))
    message = str(err.value)
    assert "its first line, '5,no header row', is read as the names of its columns" in message
    assert "add one, or pass text_key=" in message
    # a header alone, naming the column, is an empty file: no error of its own
    path.write_text("id,text\n")
    assert check_text_field([str(path)], "text", source=str(path), allow_empty=True).records == 0


def test_local_file_folder_and_glob_in_every_format(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.jsonl").write_bytes(_jsonl(TEXTS))
    (src / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(TEXTS[:3])))
    (src / "sub" / "c.jsonl.zst").write_bytes(zstandard.compress(_jsonl(TEXTS[:2])))
    (src / "d.parquet").write_bytes(_parquet(TEXTS[:4]))
    (src / "e.csv").write_bytes(_csv(TEXTS[:5]))
    (src / "notes.md").write_text("not data")  # no data format: left out
    (src / ".hidden.jsonl").write_bytes(_jsonl(TEXTS))  # dotfiles: left out

    files, resolved = _fetch_all(str(src), str(tmp_path / "folder"))
    names = [f.name for f in resolved.files]
    assert names == ["a.jsonl", "b.jsonl.gz", "d.parquet", "e.csv", "sub/c.jsonl.zst"]
    assert [f.format for f in resolved.files] == ["jsonl", "jsonl", "parquet", "csv", "jsonl"]
    assert resolved.left_out == ("notes.md",)  # reported when fetched; dotfiles are not
    for f in resolved.files:  # byte for byte, under the same relative names
        assert (tmp_path / "folder" / f.name).read_bytes() == (src / f.name).read_bytes()
    assert check_text_field(files, "text", source=str(src)).records == 7 + 3 + 4 + 5 + 2
    assert [count_records(p) for p in files] == [7, 3, 4, 5, 2]
    # downstream readers find every data file and nothing else
    assert [
        os.path.relpath(p, tmp_path / "folder") for p in dataset_files(str(tmp_path / "folder"))
    ] == names

    one, r1 = _fetch_all(str(src / "d.parquet"), str(tmp_path / "file"))
    assert [f.name for f in r1.files] == ["d.parquet"] and count_records(one[0]) == 4

    glob_files, rg = _fetch_all(str(src / "**" / "*.jsonl*"), str(tmp_path / "glob"))
    assert [f.name for f in rg.files] == ["a.jsonl", "b.jsonl.gz", "sub/c.jsonl.zst"]
    picked, rp = _fetch_all(str(src), str(tmp_path / "picked"), files=["*.csv", "sub/*"])
    assert [f.name for f in rp.files] == ["e.csv", "sub/c.jsonl.zst"]
    assert rg.left_out == rp.left_out == ()
    only_jsonl = resolve(parse_source(str(src), format="jsonl"))
    assert only_jsonl.left_out == ("d.parquet", "e.csv")  # format= reads notes.md as JSON lines
    # not in the version: without the file, the same content hash
    before = resolved.content_hash()
    (src / "notes.md").unlink()
    assert resolve(parse_source(str(src))).content_hash() == before


def test_format_given_for_files_whose_extension_does_not_say(tmp_path):
    (tmp_path / "corpus.txt").write_bytes(_jsonl(TEXTS))
    with pytest.raises(SourceError, match=r"unknown format.*corpus\.txt.*pass format="):
        resolve(parse_source(str(tmp_path / "corpus.txt")))
    files, resolved = _fetch_all(
        str(tmp_path / "corpus.txt"), str(tmp_path / "out"), format="jsonl"
    )
    # stored under a name whose extension says it, because downstream readers go by extension
    assert [f.name for f in resolved.files] == ["corpus.txt.jsonl"]
    assert format_of(files[0]) == "jsonl" and count_records(files[0]) == 7


def test_local_version_follows_the_content(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(_jsonl(TEXTS))
    first = resolve(parse_source(str(path))).content_hash()
    assert resolve(parse_source(str(path))).content_hash() == first
    path.write_bytes(_jsonl(TEXTS[::-1]))  # same size, new bytes
    assert resolve(parse_source(str(path))).content_hash() != first


def test_a_file_that_changes_while_it_is_copied_fails_verification(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(_jsonl(TEXTS))
    resolved = resolve(parse_source(str(path)))
    path.write_bytes(_jsonl(TEXTS + ["one more"]))
    with pytest.raises(SourceError, match=r"a\.jsonl failed verification.*rerun"):
        fetch(resolved, str(tmp_path / "out"))
    assert not (tmp_path / "out" / "a.jsonl").exists()
    assert not (tmp_path / "out" / ("a.jsonl" + PARTIAL_MARK)).exists()


# -- gs:// through the emulator -----------------------------------------------


def test_gs_glob_through_the_emulator(gcs_prefix, tmp_path):
    from marin_dagster import fs

    base = f"{gcs_prefix}/src"
    fs.write_bytes(f"{base}/web/0.jsonl.zst", zstandard.compress(_jsonl(TEXTS)))
    fs.write_bytes(f"{base}/web/1.jsonl.zst", zstandard.compress(_jsonl(TEXTS[:2])))
    fs.write_bytes(f"{base}/web/skip.parquet", _parquet(TEXTS))
    source = f"{base}/web/*.jsonl.zst"
    resolved = resolve(parse_source(source))
    assert [f.name for f in resolved.files] == ["0.jsonl.zst", "1.jsonl.zst"]
    assert all(f.checksum and f.checksum.startswith("md5:") for f in resolved.files)

    # into a local output and into a gs:// output
    local = fetch(resolved, str(tmp_path / "out"))
    assert check_text_field(local.files, "text", source=source).records == 9
    remote_out = f"{gcs_prefix}/out"
    remote = fetch(resolved, remote_out)
    assert remote.files == [f"{remote_out}/0.jsonl.zst", f"{remote_out}/1.jsonl.zst"]
    assert dataset_files(remote_out) == remote.files
    assert fs.read_bytes(remote.files[1]) == zstandard.compress(_jsonl(TEXTS[:2]))
    again = fetch(resolved, remote_out)
    assert again.kept == ["0.jsonl.zst", "1.jsonl.zst"] and again.downloaded == []

    # a partial download left by a killed run resumes where it stopped (a ranged read)
    resumed_out = tmp_path / "resumed"
    resumed_out.mkdir()
    whole = zstandard.compress(_jsonl(TEXTS))
    (resumed_out / ("0.jsonl.zst" + PARTIAL_MARK)).write_bytes(whole[:50])
    resumed = fetch(resolved, str(resumed_out))
    assert resumed.resumed == ["0.jsonl.zst"]
    assert (resumed_out / "0.jsonl.zst").read_bytes() == whole

    # a changed object changes the content hash; one changed after resolving fails its md5
    before = resolved.content_hash()
    fs.write_bytes(f"{base}/web/1.jsonl.zst", zstandard.compress(_jsonl(TEXTS[:3])))
    assert resolve(parse_source(source)).content_hash() != before
    with pytest.raises(SourceError, match=r"1\.jsonl\.zst failed verification"):
        fetch(resolved, str(tmp_path / "stale"))


def test_gs_bad_input_names_the_source(gcs_prefix):
    missing = f"{gcs_prefix}/nothing/here.jsonl"
    with pytest.raises(SourceError, match=r"not found.*does not exist") as e:
        resolve(parse_source(missing))
    assert missing in str(e.value)
    with pytest.raises(SourceError, match=r"the source is empty: no files match"):
        resolve(parse_source(f"{gcs_prefix}/nothing/*.jsonl"))


# -- http ---------------------------------------------------------------------


def test_http_url_resumes_a_broken_download_with_a_range_request(tmp_path):
    data = gzip.compress(_random_jsonl(400_000), compresslevel=1)
    with serve_files({"corpus/web.jsonl.gz": data}) as server:
        url = server.url("corpus/web.jsonl.gz")
        resolved = resolve(parse_source(url))
        (f,) = resolved.files
        assert f.name == "web.jsonl.gz" and f.size == len(data) and f.identity.startswith("etag=")
        server.interrupt("web.jsonl.gz", after_bytes=150_000)
        with pytest.raises(SourceError, match=r"broke off after [\d,]+ bytes.*rerun to resume"):
            fetch(resolved, str(tmp_path / "out"))
        partial = tmp_path / "out" / ("web.jsonl.gz" + PARTIAL_MARK)
        kept = partial.stat().st_size
        assert 0 < kept <= 150_000
        assert not (tmp_path / "out" / "web.jsonl.gz").exists()  # nothing under its name yet
        result = fetch(resolved, str(tmp_path / "out"))
        assert result.resumed == ["web.jsonl.gz"]
        gets = [r for r in server.requests if r.method == "GET"]
        assert gets[-1].headers.get("Range") == f"bytes={kept}-"
        assert (tmp_path / "out" / "web.jsonl.gz").read_bytes() == data
        assert result.sha256["web.jsonl.gz"] == hashlib.sha256(data).hexdigest()
        assert not partial.exists()
        # a changed file has a new ETag: a new content hash
        server.put("corpus/web.jsonl.gz", data + gzip.compress(b'{"text": "x"}\n'))
        assert resolve(parse_source(url)).content_hash() != resolved.content_hash()


def test_http_404_names_the_url(tmp_path):
    with serve_files({}) as server:
        url = server.url("missing.jsonl")
        with pytest.raises(SourceError, match=r"HTTP 404.*not found.*check the URL") as e:
            resolve(parse_source(url))
        assert url in str(e.value)


def test_a_remote_source_that_does_not_answer_is_taken_as_last_resolved(
    tmp_path, monkeypatch, caplog
):
    """Offline, an experiment with a remote source still loads (status, the UI, the steps
    after a fetched dataset); the version is the last resolution's. A 404 is an answer and
    still fails; with nothing remembered, the unreachable server fails too."""
    from assets import dataset

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    with serve_files({"web.jsonl": _jsonl(TEXTS)}) as server:
        url = server.url("web.jsonl")
        online = resolve(parse_source(url))
        version = dataset("raw/web", url).code_versions_by_key
        missing = server.url("missing.jsonl")
    # the server is gone
    with caplog.at_level("WARNING"):
        offline = resolve(parse_source(url))
    assert offline == online
    assert any(
        f"cannot reach {url}" in r.message and "as resolved at" in r.message for r in caplog.records
    )
    assert dataset("raw/web", url).code_versions_by_key == version
    with pytest.raises(SourceError, match="cannot reach"):
        resolve(parse_source(missing))  # never resolved here
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "other-cache"))
    with pytest.raises(SourceError, match="cannot reach"):
        resolve(parse_source(url))
    with serve_files({}) as server:
        with pytest.raises(SourceError, match=r"HTTP 404"):
            resolve(parse_source(server.url("web.jsonl")))


# -- the hub ------------------------------------------------------------------

CARD = b"""---
configs:
- config_name: en
  default: true
  data_files:
  - split: train
    path: en/train-*
  - split: validation
    path: en/validation-*
- config_name: fr
  data_files:
  - split: train
    path: fr/*.jsonl
---
# A dataset
"""


def _hub_files() -> dict[str, bytes]:
    return {
        "README.md": CARD,
        ".gitattributes": b"*.parquet filter=lfs\n",
        "en/train-00000-of-00002.parquet": _parquet(TEXTS[:4]),
        "en/train-00001-of-00002.parquet": _parquet(TEXTS[4:]),
        "en/validation-00000-of-00001.jsonl": _jsonl(TEXTS[:2]),
        "fr/part-0.jsonl": _jsonl(["être ou ne pas être"]),
        "scripts/build.py": b"print('not data')\n",
    }


def test_hub_dataset_with_revision_subset_split_and_files(tmp_path):
    with stand_in_hub(datasets={"someone/corpus": _hub_files()}) as hub:
        resolved = resolve(parse_source("someone/corpus"))
        # the card's default subset, every split; README, scripts and dotfiles left out
        assert [f.name for f in resolved.files] == [
            "en/train-00000-of-00002.parquet",
            "en/train-00001-of-00002.parquet",
            "en/validation-00000-of-00001.jsonl",
        ]
        assert resolved.files[0].checksum.startswith("sha256:")  # LFS
        assert resolved.files[2].checksum.startswith("git-sha1:")  # a plain git blob
        first_commit = resolved.revision
        out = fetch(resolved, str(tmp_path / "all"))
        assert check_text_field(out.files, "text", source="someone/corpus").records == 9

        train = resolve(parse_source("someone/corpus", split="train"))
        assert [f.name for f in train.files] == [
            "en/train-00000-of-00002.parquet",
            "en/train-00001-of-00002.parquet",
        ]
        fr = resolve(parse_source("hf://datasets/someone/corpus", subset="fr"))
        assert [f.name for f in fr.files] == ["fr/part-0.jsonl"]
        picked = resolve(parse_source("someone/corpus", files="en/*-00001-*"))
        assert [f.name for f in picked.files] == ["en/train-00001-of-00002.parquet"]
        # files= alone picks from the whole repo, outside the default subset too
        anywhere = resolve(parse_source("someone/corpus", files=["fr/*", "**/validation-*"]))
        assert [f.name for f in anywhere.files] == [
            "en/validation-00000-of-00001.jsonl",
            "fr/part-0.jsonl",
        ]

        # a new commit that leaves the data as it was keeps the content hash; new data moves it
        files = _hub_files()
        files["README.md"] = CARD + b"More words.\n"
        hub.add("someone/corpus", files)
        again = resolve(parse_source("someone/corpus"))
        assert again.revision != first_commit
        assert again.content_hash() == resolved.content_hash()
        files["en/validation-00000-of-00001.jsonl"] = _jsonl(TEXTS[:3])
        third = hub.add("someone/corpus", files, tags=("v3",))
        assert resolve(parse_source("someone/corpus")).content_hash() != resolved.content_hash()
        # revisions: the first commit by sha, a tag
        old = resolve(parse_source("someone/corpus", revision=first_commit))
        assert old.revision == first_commit and old.content_hash() == resolved.content_hash()
        assert resolve(parse_source("someone/corpus", revision="v3")).revision == third
        old_out = fetch(old, str(tmp_path / "old"))
        assert count_records(old_out.files[2]) == 2
        # downloads went to the pinned commit
        resolves = [r.path for r in hub.server.requests if "/resolve/" in r.path]
        assert resolves and all(f"/resolve/{first_commit}/" in p for p in resolves)


def test_hub_convention_splits_without_a_card(hub):
    hub.add(
        "roneneldan/TinyStories",
        {
            "data/train-00000-of-00001.parquet": _parquet(TEXTS),
            "data/validation-00000-of-00001.parquet": _parquet(TEXTS[:1]),
            "TinyStories-train.txt": b"raw text, not a data format",
        },
    )
    assert [f.name for f in resolve(parse_source("roneneldan/TinyStories")).files] == [
        "data/train-00000-of-00001.parquet",
        "data/validation-00000-of-00001.parquet",
    ]
    val = resolve(parse_source("roneneldan/TinyStories", split="validation"))
    assert [f.name for f in val.files] == ["data/validation-00000-of-00001.parquet"]
    with pytest.raises(SourceError, match=r"no file of split 'test'"):
        resolve(parse_source("roneneldan/TinyStories", split="test"))


def test_hub_connection_dropped_midway_is_retried_within_the_call(tmp_path):
    """huggingface_hub retries a body cut short (from the last chunk it handed over, so a
    small file starts over); the file still arrives whole and verified."""
    data = _random_jsonl(300_000, seed=1)
    with stand_in_hub(datasets={"someone/big": {"train.jsonl": data}}) as hub:
        resolved = resolve(parse_source("someone/big"))
        hub.interrupt("train.jsonl", after_bytes=100_000, mode="close")
        result = fetch(resolved, str(tmp_path / "out"))
        gets = [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]
        assert len(gets) == 2
        assert (tmp_path / "out" / "train.jsonl").read_bytes() == data
        assert result.sha256["train.jsonl"] == hashlib.sha256(data).hexdigest()


def test_hub_download_killed_midway_resumes_on_the_rerun(tmp_path):
    """A fetch in another process is SIGKILLed midway through an LFS file; the rerun keeps
    the finished file, asks for the rest with a Range request and verifies the sha256.

    huggingface_hub writes what it receives in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB), so
    the file is 2.4 chunks and the transfer stalls in the second one."""
    from huggingface_hub import constants

    chunk = constants.DOWNLOAD_CHUNK_SIZE
    big = os.urandom(int(chunk * 2.4))  # fetch copies bytes; it does not parse them
    small = _jsonl(TEXTS)
    with stand_in_hub(datasets={"someone/web": {"a.jsonl": small, "b.jsonl.gz": big}}) as hub:
        out = tmp_path / "out"
        cut = hub.interrupt("b.jsonl.gz", after_bytes=int(chunk * 1.5), mode="stall")
        code = (
            "from marin_dagster.datasets.sources import fetch, parse_source, resolve\n"
            f"fetch(resolve(parse_source('someone/web')), {str(out)!r})\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=subprocess_env(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf")),
            start_new_session=True,
        )
        partial = out / ("b.jsonl.gz" + PARTIAL_MARK)
        try:
            assert cut.reached.wait(120), "the download never reached the interruption"
            deadline = time.time() + 30
            while time.time() < deadline and (
                not partial.exists() or partial.stat().st_size < chunk
            ):
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            cut.release.set()
        kept = partial.stat().st_size
        assert kept == chunk
        assert (out / "a.jsonl").read_bytes() == small
        assert not (out / "b.jsonl.gz").exists()

        n_before = len(hub.cdn.requests)
        result = fetch(resolve(parse_source("someone/web")), str(out))
        assert result.kept == ["a.jsonl"] and result.resumed == ["b.jsonl.gz"]
        assert [r.headers.get("Range") for r in hub.cdn.requests[n_before:]] == [f"bytes={kept}-"]
        assert (out / "b.jsonl.gz").read_bytes() == big
        assert result.sha256["b.jsonl.gz"] == hashlib.sha256(big).hexdigest()
        assert not partial.exists()


def test_a_corrupt_partial_download_fails_verification_and_is_dropped(tmp_path):
    data = _jsonl(TEXTS * 50)
    with stand_in_hub(datasets={"someone/c": {"x.jsonl.zst": zstandard.compress(data)}}):
        resolved = resolve(parse_source("someone/c"))
        out = tmp_path / "out"
        out.mkdir()
        # a partial left by an earlier run whose bytes are not the file's
        (out / ("x.jsonl.zst" + PARTIAL_MARK)).write_bytes(b"\0" * 20)
        with pytest.raises(SourceError, match=r"x\.jsonl\.zst failed verification \(its sha256"):
            fetch(resolved, str(out))
        assert not (out / ("x.jsonl.zst" + PARTIAL_MARK)).exists()
        assert not (out / "x.jsonl.zst").exists()
        fetch(resolved, str(out))  # the rerun fetches it whole
        assert (out / "x.jsonl.zst").read_bytes() == zstandard.compress(data)


# -- bad input ----------------------------------------------------------------


def test_every_bad_source_is_a_clear_error(tmp_path):
    with stand_in_hub(
        datasets={"someone/corpus": _hub_files(), "someone/docs": {"README.md": b"# hi"}}
    ):
        with pytest.raises(
            SourceError, match=r"no dataset 'someone/nothing' on the hub.*check the id"
        ):
            resolve(parse_source("someone/nothing"))
        with pytest.raises(
            SourceError, match=r"revision 'v9' does not exist in the hub dataset someone/corpus"
        ):
            resolve(parse_source("someone/corpus", revision="v9"))
        with pytest.raises(SourceError, match=r"no subset 'de'.*its subsets are en, fr"):
            resolve(parse_source("someone/corpus", subset="de"))
        with pytest.raises(SourceError, match=r"no split 'test' in subset 'en'.*train, validation"):
            resolve(parse_source("someone/corpus", split="test"))
        with pytest.raises(SourceError, match=r"'someone/docs'.*the source is empty: no files"):
            resolve(parse_source("someone/docs"))
        with pytest.raises(SourceError, match=r"no file in the hub dataset .* matches files="):
            resolve(parse_source("someone/corpus", files="*.arrow"))
    with pytest.raises(
        SourceError, match=r"unknown format 'xml'; the formats are jsonl, parquet, csv"
    ):
        parse_source(str(tmp_path), format="xml")
    with pytest.raises(SourceError, match=r"no such file or folder: .*nope"):
        resolve(parse_source(str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"'.*empty': the source is empty: no files under"):
        resolve(parse_source(str(tmp_path / "empty")))
    with pytest.raises(SourceError, match=r"the source is empty: no files match"):
        resolve(parse_source(str(tmp_path / "empty" / "*.jsonl")))
    (tmp_path / "zero.jsonl").write_bytes(b"")
    with pytest.raises(SourceError, match=r"the source is empty: its 1 file\(s\) hold 0 bytes"):
        resolve(parse_source(str(tmp_path / "zero.jsonl")))
    with pytest.raises(SourceError, match=r"revision apply to Hugging Face datasets only"):
        parse_source(str(tmp_path), revision="main")


def test_a_missing_text_field_names_the_file_line_and_fields(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(_jsonl(["one"]) + b'{"id": 9, "body": "two"}\n')
    with pytest.raises(SourceError) as e:
        check_text_field([str(path)], "text", source="my-source")
    msg = str(e.value)
    assert "'my-source'" in msg and f"line 2 of {path}" in msg
    # the record before it has the field: another text_key would break that one
    assert "no field 'text'" in msg and "['body', 'id']" in msg
    assert msg.endswith("give that record its text or remove it") and "text_key=" not in msg
    path.write_bytes(b'{"id": 9, "body": "two"}\n' + _jsonl(["one"]))
    with pytest.raises(SourceError) as e:  # the first record: the field is likely wrong
        check_text_field([str(path)], "text", source="my-source")
    assert str(e.value).endswith("pass text_key=<the field holding the text>")
    path.write_bytes(_jsonl(["one"]) + b'{"id": 9, "text": 12345}\n')
    with pytest.raises(SourceError) as e:
        check_text_field([str(path)], "text", source="my-source")
    assert "field 'text' holds the int '12345', not a string: give that record its text" in str(
        e.value
    )
    pq_path = tmp_path / "b.parquet"
    pq_path.write_bytes(_parquet(TEXTS))
    with pytest.raises(
        SourceError, match=r"record 0 of .*b\.parquet has no field 'body'.*\['id', 'text'\]"
    ):
        check_text_field([str(pq_path)], "body", source="s")
    (tmp_path / "null.jsonl").write_bytes(_jsonl(["one"]) + b'{"id": 9, "text": null}\n')
    with pytest.raises(SourceError) as e:  # the field is right: no text_key hint
        check_text_field([str(tmp_path / "null.jsonl")], "text", source="s")
    assert str(e.value).endswith(
        "field 'text' is null: give that record its text or remove it"
    ) and "line 2 of" in str(e.value)
    (tmp_path / "blank.jsonl").write_bytes(b"\n\n")
    with pytest.raises(SourceError, match=r"the source is empty: its 1 file\(s\) hold no records"):
        check_text_field([str(tmp_path / "blank.jsonl")], "text", source="s")
    (tmp_path / "array.json").write_bytes(b'[{"text": "a"},\n {"text": "b"}]\n')
    with pytest.raises(SourceError, match=r"array\.json: line 1: invalid JSON.*pass format="):
        check_text_field([str(tmp_path / "array.json")], "text", source="s")


def test_broken_lines_are_reported_unless_most_of_the_sample_is_broken(tmp_path):
    """A broken line is the reading step's to skip or fail on (the dataset is a copy); a
    sample mostly of broken lines is a file in another format, and fails here."""
    lines = _jsonl(TEXTS).splitlines(keepends=True)
    some = tmp_path / "some.jsonl"
    some.write_bytes(b"".join(lines[:2] + [b'{"text": "tab\there"}\n', b"\xff\n"] + lines[2:]))
    check = check_text_field([str(some)], "text", source="s")
    assert check.records == len(TEXTS)
    assert check.broken[0].startswith(f"{some}: line 3: invalid JSON (Invalid control character")
    assert check.broken[1].startswith(f"{some}: line 4: invalid UTF-8 at byte 0")
    assert len(check.broken) == 2
    # the sample counts broken lines: the third good record is past a sample of four
    assert check_text_field([str(some)], "text", source="s", sample=4).records == 2
    mostly = tmp_path / "mostly.jsonl"
    mostly.write_bytes(lines[0] + b"{\n" + b"}\n")
    with pytest.raises(SourceError, match=r"mostly\.jsonl: line 2: invalid JSON.*pass format="):
        check_text_field([str(mostly)], "text", source="s")


def test_a_copy_the_disk_refuses_blames_the_disk_not_the_source(tmp_path):
    """A fetch that cannot write its copy (a full disk) names the copy and says to make
    room; it does not call the source's download broken, which no rerun would fix."""
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(_random_jsonl(300_000, seed=3))
    out = tmp_path / "out"
    # RLIMIT_FSIZE makes the kernel refuse the copy past 64 KiB (EFBIG), as a full disk
    # does (ENOSPC); in a child process so pytest's own files are not limited.
    script = textwrap.dedent(
        f"""
        import resource, signal
        from marin_dagster.datasets.sources import fetch, parse_source, resolve
        resolved = resolve(parse_source({str(source)!r}))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
        try:
            fetch(resolved, {str(out)!r})
        except Exception as e:
            print(type(e).__name__, e, *getattr(e, "__notes__", ()))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout
    assert said.startswith("OSError") and "File too large" in said, said
    assert str(out / "corpus.jsonl.tmp-partial") in said and "make room" in said, said
    assert "broke off" not in said


def test_a_relative_data_file_that_is_missing_is_no_such_file_not_a_hub_id(tmp_path, monkeypatch):
    """`src/notes.jsonl` has the shape of a hub id (owner/name): taken for one, a typo in
    the folder gave "the hub at https://huggingface.co is unreachable" on this machine."""
    monkeypatch.chdir(tmp_path)
    for source in ("src/notes.jsonl", "src/notes.csv.gz", "data/train.parquet"):
        spec = parse_source(source)
        assert (spec.kind, spec.location) == ("local", str(tmp_path / source))
        with pytest.raises(SourceError) as err:
            resolve(spec)
        assert str(err.value) == (
            f"dataset source {source!r}: no such file or folder: {tmp_path / source}; check "
            f"the path (relative paths are relative to {tmp_path})"
        )
    # a hub id stays one (a folder of that name here would win)
    assert parse_source("someone/corpus").kind == "hub"
    (tmp_path / "src" / "notes.jsonl").parent.mkdir()
    (tmp_path / "src" / "notes.jsonl").write_text('{"text": "here"}\n')
    assert len(resolve(parse_source("src/notes.jsonl")).files) == 1
