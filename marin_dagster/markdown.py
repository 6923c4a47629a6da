"""Text shown in the Dagster UI's markdown metadata, shown as it is."""

from __future__ import annotations

import re

# C0 and C1 control characters but newline and tab: an undertrained byte-level model
# samples them, and the UI shows them as nothing or as boxes.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def code_block(text: str) -> str:
    """`text` verbatim in a fenced block: control characters escaped (`\\x07`), and a fence
    longer than any run of backticks in the text, so the text cannot close it."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"
