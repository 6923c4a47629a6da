"""Fuzzy dedup's defaults are safe: a removed document is linked to a kept one by true Jaccard.

The property (docs/dupekit.md, "What verify=True guarantees"): with the default
`verify=True`, every removed document reaches its cluster's kept document
through links whose true Jaccard (over the exact shingle strings, never over
signatures) is at or above the threshold. Tested on generated clusters of
near-copies made by word replacement (some copies of copies, so links can
chain), mixed with unrelated documents. The same corpus with `verify=False`
breaks the property, which shows what the check buys and that the test can fail.
"""

from __future__ import annotations

import glob
import random
from collections import deque

import pytest

from marin_dagster.dupekit import DedupConfig, deduplicate
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_strings
from tests.dupekit.corpus import read_jsonl_gz, write_jsonl_gz

THRESHOLD = 0.8
# Word replacement rates of the near-copies: char 5-gram Jaccard about 0.95 down to 0.5,
# so pairs sit on both sides of the threshold.
RATES = (0.01, 0.03, 0.05, 0.07, 0.09, 0.12, 0.2)


def _vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12, 9, 8, 7, 7, 6, 6, 6, 5, 4, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    return sorted(
        {"".join(rng.choices(letters, weights, k=rng.randint(2, 9))) for _ in range(size)}
    )


def _prose(rng: random.Random, vocabulary: list[str], words: int = 330) -> str:
    """About 2 KB of sentences: capitalized, punctuated, Zipf-like word frequencies."""
    out, sentence = [], []
    ranks = [1.0 / (i + 1) for i in range(len(vocabulary))]
    for word in rng.choices(vocabulary, ranks, k=words):
        sentence.append(word)
        if len(sentence) >= rng.randint(6, 18):
            out.append(" ".join(sentence).capitalize() + rng.choice(".,;!?"))
            sentence = []
    return " ".join(out + [" ".join(sentence)])


def _replace_words(text: str, rate: float, rng: random.Random, vocabulary: list[str]) -> str:
    return " ".join(rng.choice(vocabulary) if rng.random() < rate else w for w in text.split(" "))


def clustered_corpus(seed: int = 0, families: int = 30, unrelated: int = 80) -> list[dict]:
    """Families of near-copies (some copied from a copy) and unrelated documents, shuffled."""
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng)
    docs = []
    for f in range(families):
        members = [_prose(rng, vocabulary)]
        for c in range(6):
            # Every other copy is made from the previous copy: chains of near-copies.
            parent = members[-1] if c % 2 else members[0]
            members.append(_replace_words(parent, rng.choice(RATES), rng, vocabulary))
        docs += [{"id": f"f{f:03d}-m{m}", "text": t} for m, t in enumerate(members)]
    docs += [{"id": f"u{u:03d}", "text": _prose(rng, vocabulary)} for u in range(unrelated)]
    rng.shuffle(docs)
    return docs


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def removals_without_a_true_path(
    docs: list[dict], result, shingles: ShingleConfig, threshold: float
) -> list[str]:
    """Removed documents that no chain of links, each at true Jaccard >= threshold, joins to
    their cluster's kept document."""
    sets = {d["id"]: set(shingle_strings(d["text"], shingles)) for d in docs}
    attributes = {r["id"]: r for p in result.attributes for r in read_jsonl_gz(p)}
    links = [
        (r["a"], r["b"])
        for p in glob.glob(f"{result.output_path}/links/*.jsonl.gz")
        for r in read_jsonl_gz(p)
    ]
    good: dict[str, list[str]] = {}
    for a, b in links:
        if _jaccard(sets[a], sets[b]) >= threshold:
            good.setdefault(a, []).append(b)
            good.setdefault(b, []).append(a)
    bad = []
    for doc_id, attrs in sorted(attributes.items()):
        if not attrs["duplicate"]:
            continue
        kept = attrs["cluster_id"]
        assert not attributes[kept]["duplicate"], f"{doc_id}'s cluster {kept} was removed too"
        seen, queue = {doc_id}, deque([doc_id])
        while queue and kept not in seen:
            for nxt in good.get(queue.popleft(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        if kept not in seen:
            bad.append(doc_id)
    return bad


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    docs = clustered_corpus()
    root = tmp_path_factory.mktemp("clustered")
    files = [write_jsonl_gz(str(root / f"part-{i}.jsonl.gz"), docs[i::3]) for i in range(3)]
    return docs, files


def test_verify_is_the_default():
    assert DedupConfig().verify is True
    assert DedupConfig(mode="fuzzy").verify is True


@pytest.mark.parametrize("kind", ["char", "word"])
def test_default_removals_are_linked_through_true_jaccard(clustered, local_ctx, tmp_path, kind):
    docs, files = clustered
    ngram = 5
    result = deduplicate(
        files,
        str(tmp_path / "out"),
        DedupConfig(mode="fuzzy", shingle=kind, ngram=ngram),
        context=local_ctx,
    )
    removed = result.counts["document"]["duplicates"]
    # Not vacuous: char shingles join most near-copies; word 5-grams only the closest
    # (one replaced word changes five shingles).
    assert removed >= (60 if kind == "char" else 10), result.counts
    assert result.counts["fuzzy"]["exact_checked"] > 0
    assert removals_without_a_true_path(docs, result, ShingleConfig(kind, ngram), THRESHOLD) == []


def test_without_verification_documents_are_removed_without_a_true_path(
    clustered, local_ctx, tmp_path
):
    """What verify=False costs, on the same corpus: links below the threshold remove documents."""
    docs, files = clustered
    result = deduplicate(
        files, str(tmp_path / "out"), DedupConfig(mode="fuzzy", verify=False), context=local_ctx
    )
    wrong = removals_without_a_true_path(docs, result, ShingleConfig("char", 5), THRESHOLD)
    assert len(wrong) >= 5, wrong
