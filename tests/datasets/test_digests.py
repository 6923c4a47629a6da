"""A local source's version follows its bytes: a touched or copied file keeps it, an edit
that restores the size and mtime does not."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from assets import dataset
from marin_dagster.datasets import digests
from marin_dagster.datasets.digests import file_sha256


def _version(asset) -> str:
    return asset.code_versions_by_key[asset.key]


def test_touching_or_copying_a_file_keeps_its_version_and_an_edit_changes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "notes.jsonl"
    src.write_text('{"text": "to be"}\n{"text": "or not"}\n')
    first = _version(dataset("raw/notes", str(src)))

    os.utime(src, (1_000_000, 1_000_000))  # touch
    assert _version(dataset("raw/notes", str(src))) == first
    # copied into place again, as `cp` without -p does (new mtime) and as `rsync` or a
    # `git checkout` does (a new inode renamed over it)
    shutil.copy(src, tmp_path / "saved")
    shutil.copy(tmp_path / "saved", src)
    assert _version(dataset("raw/notes", str(src))) == first
    shutil.copy(tmp_path / "saved", tmp_path / "fresh")
    os.replace(tmp_path / "fresh", src)
    assert _version(dataset("raw/notes", str(src))) == first

    # the same size and mtime, other bytes: the inode's change time gives it away
    st = os.stat(src)
    src.write_text('{"text": "to be"}\n{"text": "or NOT"}\n')
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(src) == st.st_size
    assert _version(dataset("raw/notes", str(src))) != first


def test_the_hash_is_remembered_by_stat_and_redone_when_the_file_moves(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "x"}\n')
    real = hashlib.sha256(path.read_bytes()).hexdigest()
    assert file_sha256(str(path)) == real
    # the entry is what a later process reads: while the stat matches, the file is not read
    entry = digests._entry_path(str(path))
    with open(entry) as f:
        cached = json.load(f)
    cached["sha256"] = "0" * 64
    with open(entry, "w") as f:
        json.dump(cached, f)
    assert file_sha256(str(path)) == "0" * 64
    path.write_bytes(b'{"text": "y"}\n')
    assert file_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_cache_that_cannot_be_written_only_costs_time(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("MARIN_CACHE_DIR", str(blocked / "cache"))  # under a file: no folder
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "x"}\n')
    assert file_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_entries_of_files_that_are_gone_are_pruned_once_a_day(tmp_path, monkeypatch):
    # One entry per path ever hashed: files dropped in a watched inbox and deleted later
    # would each leave theirs for good.
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    files = {}
    for name in ("a", "b", "c", "d"):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text(f'{{"text": "{name}"}}\n')

    def entries() -> list[str]:
        root = tmp_path / "cache" / "digests"
        return sorted(
            json.loads(p.read_text())["path"] for p in root.glob("*/*.json") if p.is_file()
        )

    file_sha256(str(files["a"]))
    file_sha256(str(files["b"]))
    files["a"].unlink()
    killed = tmp_path / "cache" / "digests" / "00" / "abc.json.123.tmp"  # a killed writer's
    killed.parent.mkdir(parents=True, exist_ok=True)
    killed.write_text("{")
    os.utime(killed, (1_000_000, 1_000_000))
    marker = tmp_path / "cache" / "digests" / ".pruned"
    if marker.exists():
        os.utime(marker, (1_000_000, 1_000_000))  # the last prune was a day ago
    file_sha256(str(files["c"]))
    assert entries() == [str(files["b"]), str(files["c"])]
    assert not killed.exists()
    # pruned at most once a day: b's entry stays until the next
    files["b"].unlink()
    file_sha256(str(files["d"]))
    assert entries() == [str(files["b"]), str(files["c"]), str(files["d"])]
    assert digests.prune(every_s=0) == 1
    assert entries() == [str(files["c"]), str(files["d"])]
