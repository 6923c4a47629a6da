"""The shingle hash, its vectorized forms, text normalization and shingling."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_dagster.dupekit.hashing import PrefixHashes, shingle_hash, text_hash128
from marin_dagster.dupekit.shingles import (
    ShingleConfig,
    shingle_hash_set,
    shingle_hashes,
    shingle_strings,
)
from marin_dagster.dupekit.text import (
    SEPARATOR,
    batch_codepoints_for_shingles,
    codepoints_for_shingles,
    normalize_for_exact,
    normalize_for_shingles,
    split_paragraphs,
)

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)


def test_shingle_hash_definition():
    # The polynomial written out: (c + 1) * B^(L - q) summed modulo 2^64, top 32 bits.
    b, m = 0x9E3779B97F4A7C15, 1 << 64
    assert shingle_hash("") == 0
    assert shingle_hash("a") == ((98 * b) % m) >> 32
    assert shingle_hash("ab") == ((98 * b * b + 99 * b) % m) >> 32
    assert shingle_hash("ab") != shingle_hash("ba")
    assert shingle_hash("\x00a") != shingle_hash("a")  # U+0000 still counts
    # A change in the last code point reaches the top bits.
    assert len({shingle_hash("abcd" + c) for c in "abcdefghij"}) == 10


def test_shingle_hash_spreads_similar_shingles():
    # Every word 5-gram of a vocabulary's small variations: no collisions among 40k
    # distinct shingles (a 32-bit hash expects about 0.2).
    words = [f"w{i}" for i in range(200)]
    shingles = {" ".join(words[(i + k * 7) % 200] for k in range(5)) for i in range(200)}
    shingles |= {f"{a} {b}" for a in words for b in words}
    assert len({shingle_hash(s) for s in shingles}) == len(shingles)


@settings(max_examples=25, deadline=None)
@given(text=TEXT, n=st.integers(1, 7))
def test_windows_equal_scalar_hash(text: str, n: int):
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    expected = [shingle_hash(text[i : i + n]) for i in range(len(text) - n + 1)]
    assert PrefixHashes(cps).windows(n).tolist() == expected


@settings(max_examples=25, deadline=None)
@given(text=st.text(min_size=1, max_size=60), data=st.data())
def test_segments_equal_scalar_hash(text: str, data: st.DataObject):
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    starts = data.draw(st.lists(st.integers(0, len(text) - 1), min_size=1, max_size=10))
    ends = [data.draw(st.integers(s, len(text))) for s in starts]
    expected = [shingle_hash(text[s:e]) for s, e in zip(starts, ends, strict=True)]
    assert PrefixHashes(cps).runs(np.array(starts), np.array(ends), 1).tolist() == expected


def test_segments_of_a_long_array_and_its_ends():
    rng = np.random.default_rng(0)
    cps = rng.integers(32, 0x3000, size=300_000).astype(np.uint32)
    text = cps.astype("<u4").tobytes().decode("utf-32-le")
    prefix = PrefixHashes(cps)
    starts = np.array([0, 5, len(cps) - 7, 150_000, 299_999])
    ends = np.array([40, 5, len(cps), 170_000, 300_000])
    got = prefix.runs(starts, ends, 1).tolist()
    assert got == [shingle_hash(text[s:e]) for s, e in zip(starts, ends, strict=True)]
    assert prefix.windows(5)[-1] == shingle_hash(text[-5:])
    assert len(PrefixHashes(cps[:3]).windows(5)) == 0


@settings(max_examples=25, deadline=None)
@given(text=TEXT)
def test_numpy_normalization_equals_regex(text: str):
    assert codepoints_for_shingles(text).tobytes().decode("utf-32-le") == normalize_for_shingles(
        text
    )


@settings(max_examples=50, deadline=None)
@given(
    texts=st.lists(
        st.one_of(TEXT, st.sampled_from(["", " ", "\x00", "a\x00 b", " x ", "𝄞 y"])), max_size=8
    )
)
def test_batch_normalization_equals_one_text_at_a_time(texts: list[str]):
    cps, starts, ends = batch_codepoints_for_shingles(texts)
    assert len(starts) == len(ends) == len(texts)
    got = [cps[s:e].astype(np.uint32).tobytes() for s, e in zip(starts, ends, strict=True)]
    assert got == [codepoints_for_shingles(t).tobytes() for t in texts]
    assert all(cps[e] == SEPARATOR for e in ends[:-1])


@settings(max_examples=50, deadline=None)
@given(
    texts=st.lists(
        st.text(alphabet=st.characters(max_codepoint=127), max_size=60)
        | st.sampled_from(["", " ", "\t\x1c", "A-B", " x ", "it's  ok. "]),
        max_size=8,
    )
)
def test_ascii_batch_normalization_equals_one_text_at_a_time(texts: list[str]):
    cps, starts, ends = batch_codepoints_for_shingles(texts)
    assert cps.dtype == np.uint8 or not texts
    got = [cps[s:e].astype(np.uint32).tobytes() for s, e in zip(starts, ends, strict=True)]
    assert got == [codepoints_for_shingles(t).tobytes() for t in texts]


def test_normalization_on_shakespeare(shakespeare_docs):
    for doc in shakespeare_docs[:12]:
        assert codepoints_for_shingles(doc["text"]).tobytes().decode(
            "utf-32-le"
        ) == normalize_for_shingles(doc["text"])


def test_normalizations():
    assert normalize_for_shingles("  Hello,\tWORLD!!  it's  x_y 𝄞 ") == "hello world its x_y"
    assert normalize_for_exact("  Hello,\tWORLD!!\n\n") == "hello, world!!"
    assert normalize_for_shingles("--- ...") == ""


@settings(max_examples=25, deadline=None)
@given(text=TEXT, kind=st.sampled_from(["char", "word"]), n=st.integers(1, 6))
def test_vectorized_shingle_hashes_equal_strings(text: str, kind: str, n: int):
    config = ShingleConfig(kind, n)  # type: ignore[arg-type]
    hashes = shingle_hashes(text, config)
    assert hashes.tolist() == [shingle_hash(s) for s in shingle_strings(text, config)]


def test_shingles_of_real_text(shakespeare_docs):
    text = shakespeare_docs[0]["text"][:20000]
    for config in (ShingleConfig("char", 5), ShingleConfig("word", 5)):
        assert set(shingle_hashes(text, config).tolist()) == shingle_hash_set(text, config)
    words = shingle_strings("The cat, the HAT; and the bat.", ShingleConfig("word", 3))
    assert words == ["the cat the", "cat the hat", "the hat and", "hat and the", "and the bat"]
    assert shingle_strings("ab cd", ShingleConfig("char", 5)) == ["ab cd"]
    assert shingle_strings("ab c", ShingleConfig("char", 5)) == []


def test_shingle_config_rejects_bad_values():
    with pytest.raises(ValueError, match="'line'"):
        ShingleConfig("line", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got 0"):
        ShingleConfig("char", 0)


def test_text_hash128():
    h = text_hash128("hello")
    assert re.fullmatch(r"[0-9a-f]{32}", h)
    assert h != text_hash128("hello ")


def test_split_paragraphs():
    text = "first line\n\n  \nsecond\nthird"
    spans = split_paragraphs(text)
    assert [text[s:e] for s, e in spans] == ["first line", "second", "third"]
