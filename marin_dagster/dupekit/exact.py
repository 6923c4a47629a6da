"""Exact dedup stages: document and paragraph hashes grouped by Zephyr group_by.

Stage functions are small callable dataclasses so Zephyr can ship them to
worker processes and Ray tasks by value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from marin_dagster.dupekit.hashing import text_hash128
from marin_dagster.dupekit.records import SourceFile, iter_docs, key_position
from marin_dagster.dupekit.text import has_unencodable, normalize_for_exact, split_paragraphs
from marin_dagster.zephyr import counters

# The paragraph index appended to a document's node key: fixed width, so the
# order is document order first, then paragraph order.
_PARAGRAPH_DIGITS = 8
# Documents holding a lone surrogate (hashed with U+FFFD in its place, written unchanged).
UNENCODABLE_COUNTER = "dedup/document/unencodable"


@dataclass(frozen=True)
class DocumentHashes:
    """Per document: `(128-bit normalized-text hash, node key)` of the whole text: a hash of
    a prefix would call two documents that differ after it duplicates, and remove one."""

    text_key: str
    id_key: str

    def __call__(self, source: SourceFile) -> Iterator[tuple[str, str]]:
        for doc in iter_docs(source, self.text_key, self.id_key):
            text = doc.text
            if has_unencodable(text):  # hashed with U+FFFD in their place (text.py)
                counters.increment(UNENCODABLE_COUNTER)
            norm = normalize_for_exact(text)
            if not norm:
                counters.increment("dedup/document/passed_through")
                continue
            yield text_hash128(norm), doc.key


@dataclass(frozen=True)
class ParagraphHashes:
    """Per paragraph: `(hash, node key + paragraph index, start, end)`."""

    text_key: str
    id_key: str
    max_chars: int

    def __call__(self, source: SourceFile) -> Iterator[tuple[str, str, int, int]]:
        for doc in iter_docs(source, self.text_key, self.id_key):
            text = doc.text
            spans = split_paragraphs(text)
            if not spans:
                counters.increment("dedup/document/passed_through")
            if len(text) > self.max_chars:
                counters.increment("dedup/document/truncated")
                # Only whole paragraphs within the limit are hashed. The head of a paragraph
                # that the limit cuts could equal another paragraph; marking that head as a
                # duplicate would cut it out and leave the paragraph's rest behind.
                spans = [(start, end) for start, end in spans if end <= self.max_chars]
                text = text[: self.max_chars]
            if has_unencodable(text):
                counters.increment(UNENCODABLE_COUNTER)
            for p, (start, end) in enumerate(spans):
                counters.increment("dedup/paragraph/total")
                yield (
                    text_hash128(normalize_for_exact(text[start:end])),
                    f"{doc.key}{p:0{_PARAGRAPH_DIGITS}x}",
                    start,
                    end,
                )


def hash_of(item: tuple) -> str:
    return item[0]


def first_of_document_group(digest: str, items: Iterator[tuple[str, str]]) -> Iterator[dict]:
    """Keep the smallest node key; mark the others as its duplicates."""
    keys = sorted({key for _h, key in items})
    for key in keys[1:]:
        file_index, record_index = key_position(key)
        yield {"file": file_index, "record": record_index, "cluster": keys[0]}


def first_of_paragraph_group(
    digest: str, items: Iterator[tuple[str, str, int, int]]
) -> Iterator[dict]:
    members = sorted({(key, start, end) for _h, key, start, end in items})
    for key, start, end in members[1:]:
        file_index, record_index = key_position(key[:-_PARAGRAPH_DIGITS])
        yield {"file": file_index, "record": record_index, "span": [start, end]}
