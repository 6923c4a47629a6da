"""Where an output's files came from, so that an error about a copy names the original.

A step that copies files it did not make (`dataset(...)` fetches a user's files) records
each one's origin in `.origins.json`. A later step that fails on such a file (a broken
line the tokenizer meets) names the copy, `data/raw/notes-<version>/docs.jsonl`; editing
the copy would leave the source and the versions disagreeing. `note_origins` adds to the
error which original to fix, and that the fix is picked up as a new version.
"""

from __future__ import annotations

from collections.abc import Mapping

from marin_dagster import fs
from marin_dagster.execution.status import ORIGINS_FILE


def write_origins(output_path: str, origins: Mapping[str, str]) -> None:
    """Record `{name in the output: where it came from}` (a path, a URL, an hf:// URL)."""
    fs.write_json(fs.join(output_path, ORIGINS_FILE), dict(sorted(origins.items())))


def read_origins(output_path: str) -> dict[str, str]:
    """The recorded origins, or {} for an output of files its step made itself."""
    found = fs.read_json_or_none(fs.join(output_path, ORIGINS_FILE))
    return found if isinstance(found, dict) else {}


def _names_an_input(error: BaseException, inputs: Mapping[str, str]) -> bool:
    message = str(error)
    return any(root in message or fs.normalize(root) in message for root in inputs.values())


def note_origins(error: BaseException, inputs: Mapping[str, str], names: Mapping[str, str]) -> None:
    """Add a note to `error` for each copied input file its message names.

    `inputs` maps an input's role to its output path, `names` the role to its asset name.
    The note goes on the innermost error in the chain that names the file (the engine's
    wrapping of it names it too): that error is the one a run's summary shows."""
    while error.__cause__ is not None and _names_an_input(error.__cause__, inputs):
        error = error.__cause__
    message = str(error)
    for role, root in inputs.items():
        if root not in message and fs.normalize(root) not in message:
            continue  # the common case: no need to read the input's origins
        try:
            origins = read_origins(root)
        except (OSError, ValueError):
            continue  # a note must not hide the error it is about
        for rel, origin in origins.items():
            copies = {fs.join(root, rel), fs.join(fs.normalize(root), rel)}
            copy = next((c for c in copies if c in message), None)
            if copy is not None:
                error.add_note(
                    f"{copy} is {names[role]}'s copy of {origin}: a fix to the file belongs "
                    f"there, not in the copy. The changed source gives {names[role]} a new version, "
                    "fetched on the next run, and the steps after it read that one."
                )
