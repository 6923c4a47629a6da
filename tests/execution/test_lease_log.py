"""A run that takes over a dead run's lease says so in the Dagster run log, not only on stderr."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import dagster as dg

from assets import folder_corpus, watched_folder
from marin_dagster.execution.status import LOCK_FILE, StepStatus, read_status
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource


def test_stale_lease_takeover_is_in_the_run_log(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.txt").write_text("text")
    corpus = folder_corpus("raw/inbox_corpus", source=watched_folder("raw/inbox", str(inbox)))
    storage = StorageResource(prefix=str(tmp_path / "data"))
    output = storage.output_path("raw/inbox_corpus", corpus.code_versions_by_key[corpus.key])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.makedirs(output)
    with open(os.path.join(output, LOCK_FILE), "w") as f:  # what a killed run leaves behind
        json.dump(
            {
                "token": "dead",
                "run_id": "killed-run",
                "host": socket.gethostname(),
                "pid": dead.pid,
                "heartbeat_at": time.time(),
            },
            f,
        )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus],
            instance=instance,
            resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)},
        )
        assert result.success
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if not e.is_dagster_event and e.level == logging.WARNING
        ]
    assert any(
        "taking over the stale lease" in m and "killed-run" in m and str(dead.pid) in m
        for m in warnings
    ), warnings
    assert read_status(output).status == StepStatus.SUCCESS
