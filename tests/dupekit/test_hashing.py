"""The shingle hash, its vectorized forms, text normalization and shingling."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_dagster.dupekit.hashing import (
    murmur3_32,
    murmur3_segments,
    murmur3_windows,
    shingle_hash,
    text_hash128,
)
from marin_dagster.dupekit.shingles import (
    ShingleConfig,
    shingle_hash_set,
    shingle_hashes,
    shingle_strings,
)
from marin_dagster.dupekit.text import (
    batch_codepoints_for_shingles,
    codepoints_for_shingles,
    normalize_for_exact,
    normalize_for_shingles,
    split_paragraphs,
)

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)


def test_murmur3_published_vectors():
    # SMHasher's MurmurHash3_x86_32 verification values.
    assert murmur3_32(b"", 0) == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"test", 0) == 0xBA6BD213
    assert murmur3_32(b"Hello, world!", 0) == 0xC0363E43
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog", 0) == 0x2E4FF723
    assert murmur3_32(b"abc", 0) == 0xB3DD93FA


def test_shingle_hash_is_murmur3_of_utf32():
    assert shingle_hash("test") == murmur3_32("test".encode("utf-32-le"))
    assert shingle_hash("ab") != shingle_hash("ba")


@settings(max_examples=25, deadline=None)
@given(text=TEXT, n=st.integers(1, 7))
def test_windows_equal_scalar_hash(text: str, n: int):
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    expected = [shingle_hash(text[i : i + n]) for i in range(len(text) - n + 1)]
    assert murmur3_windows(cps, n).tolist() == expected


@settings(max_examples=25, deadline=None)
@given(text=st.text(min_size=1, max_size=60), data=st.data())
def test_segments_equal_scalar_hash(text: str, data: st.DataObject):
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    starts = data.draw(st.lists(st.integers(0, len(text) - 1), min_size=1, max_size=10))
    lengths = [data.draw(st.integers(0, len(text) - s)) for s in starts]
    expected = [shingle_hash(text[s : s + n]) for s, n in zip(starts, lengths, strict=True)]
    assert murmur3_segments(cps, np.array(starts), np.array(lengths)).tolist() == expected


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
    cps, offsets = batch_codepoints_for_shingles(texts)
    assert len(offsets) == len(texts) + 1
    got = [cps[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(texts))]
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
