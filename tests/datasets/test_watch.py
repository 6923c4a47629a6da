"""The folder's stat cache: a tick on 10,000 files hashes only what changed.

Dagster stops a sensor evaluation after 60 s; what keeps a tick far inside
that on a large folder is reading only changed files (and, with watchdog,
statting only changed paths). The test counts that work instead of timing it;
benchmarks/watched_folder_scan.py prints the times.
"""

from __future__ import annotations

import os
import time

import dagster as dg
import pytest
from dagster._core.definitions.observe import observe  # not re-exported by dagster 1.13

from assets import watched_folder
from marin_dagster.datasets.watch import (
    FolderState,
    content_hash,
    file_digest,
    forget_folder_states,
)

N = 10_000


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("big")
    for i in range(N):
        sub = folder / f"d{i % 20:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i:05d}.txt").write_text(f"document {i}\n")
    return str(folder)


def expected_hash(folder: str) -> str:
    digests = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if not name.startswith("."):
                path = os.path.join(root, name)
                digests[os.path.relpath(path, folder)] = file_digest(path)
    return content_hash(digests)


def wait_for_events(state: FolderState, *paths: str) -> None:
    """Wait until watchdog has reported every path (its events arrive on another thread)."""
    deadline = time.time() + 30
    while not all(p in state._dirty for p in paths) and time.time() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("watch", [True, False], ids=["watchdog", "polling"])
def test_a_tick_on_10000_files_hashes_only_changed_files(big_folder, watch):
    state = FolderState(big_folder, watch=watch)
    try:
        first = state.snapshot()
        assert (first.files, first.hashed, first.full_scan) == (N, N, True)
        assert first.content_hash == expected_hash(big_folder)

        again = state.snapshot()
        assert again.hashed == 0 and again.content_hash == first.content_hash
        assert again.statted == (0 if watch else N)

        changed = [
            os.path.join(big_folder, f"d{i % 20:02d}", f"f{i:05d}.txt") for i in (3, 500, 9999)
        ]
        for path in changed:
            with open(path, "a") as f:
                f.write("edited\n")
        added = os.path.join(big_folder, "d00", "new.txt")
        with open(added, "w") as f:
            f.write("new\n")
        removed = os.path.join(big_folder, "d01", "f00001.txt")
        os.rename(removed, removed + ".bak")  # moved away: a delete and an add of another name
        if watch:
            wait_for_events(state, *changed, added, removed, removed + ".bak")

        after = state.snapshot()
        assert after.files == N + 1
        assert (
            after.hashed == 5
        )  # 3 edited, 1 added, 1 renamed (its content is read under the new name)
        assert after.statted <= 10 if watch else after.statted == N + 1
        assert after.content_hash == expected_hash(big_folder)
        assert after.content_hash != first.content_hash
    finally:
        state.close()
        os.rename(removed + ".bak", removed)
        os.remove(added)
        for path in changed:
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace("edited\n", ""))


def test_new_folders_moved_in_are_scanned_whole(tmp_path):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    state = FolderState(str(folder), watch=True)
    try:
        state.snapshot()
        staging = tmp_path / "staging"
        (staging / "deep").mkdir(parents=True)
        for i in range(5):
            (staging / "deep" / f"{i}.txt").write_text(str(i))
        os.rename(staging, folder / "batch")  # its files never fire events under the folder
        wait_for_events(state, str(folder / "batch"))
        snap = state.snapshot()
        assert snap.files == 6 and not snap.full_scan
        assert snap.content_hash == expected_hash(str(folder))
        os.rename(folder / "batch", tmp_path / "gone")
        wait_for_events(state, str(folder / "batch"))
        assert state.snapshot().content_hash == expected_hash(str(folder))
    finally:
        state.close()


def test_observing_the_watched_folder_records_its_content_hash(tmp_path):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "a.txt").write_text("to be")
    (folder / ".a.txt.swp").write_text("editor state is not content")
    inbox = watched_folder("raw/inbox", str(folder))
    forget_folder_states()
    try:
        with dg.instance_for_test() as instance:
            assert observe([inbox], instance=instance).success
            record = instance.get_latest_data_version_record(inbox.key, is_source=True)
            version = record.asset_observation.tags["dagster/data_version"]
    finally:
        forget_folder_states()
    assert version == expected_hash(str(folder))
