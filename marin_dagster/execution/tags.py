"""The run tags Marin reads and sets: one list, so that a misspelled one is caught.

A run tag under `marin/` that is none of these (`marin/froce=true`) would be ignored in
silence, and the run would skip every step it was meant to redo.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

FORCE_TAG = "marin/force"
"""true: every step of the run rebuilds, even where its output is current."""

# Which process drives a run, recorded when the run starts, so that a run whose process was
# killed (kill -9, OOM, a closed laptop) can be told apart from a live one.
RUN_PID_TAG = "marin/run_pid"
RUN_HOST_TAG = "marin/run_host"
RUN_PROCESS_START_TAG = "marin/run_process_start"

# A watched-folder sensor's runs: which sensor, and the folder content it was asked for.
WATCH_TAG = "marin/watched"
CONTENT_TAG = "marin/content_hash"

RUN_TAGS = (
    FORCE_TAG,
    RUN_PID_TAG,
    RUN_HOST_TAG,
    RUN_PROCESS_START_TAG,
    WATCH_TAG,
    CONTENT_TAG,
)


def check_run_tags(tags: Mapping[str, str]) -> None:
    """Refuse a `marin/` run tag that Marin neither reads nor sets, naming the likely one."""
    for key in tags:
        if key.startswith("marin/") and key not in RUN_TAGS:
            close = difflib.get_close_matches(key, RUN_TAGS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(
                f"run tag {key}={tags[key]!r} is not one Marin reads; {hint}"
                f"its run tags are {', '.join(RUN_TAGS)}"
            )
