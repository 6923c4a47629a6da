"""Sampled and decoded text in the UI's markdown metadata."""

from __future__ import annotations

from marin_dagster.markdown import code_block


def test_control_bytes_are_escaped_and_the_rest_is_kept():
    # what an undertrained byte-level model samples: NUL, BEL, ESC, DEL, a C1 byte
    text = "To be\x00 or\x07 not\x1b[0m\x7f\x85\n\tthat is — the question"
    assert code_block(text) == (
        "```\nTo be\\x00 or\\x07 not\\x1b[0m\\x7f\\x85\n\tthat is — the question\n```"
    )


def test_backticks_in_the_text_cannot_close_the_fence():
    block = code_block("a ``` b ```` c")
    assert block.startswith("`````\n") and block.endswith("\n`````")
    assert "a ``` b ```` c" in block
