"""Fuzz the input readers with truncated, corrupted and mis-encoded files.

Every reader that turns a file into records (Zephyr's record and batch
readers, the token cache's `read_records`; dedup reads through Zephyr's
`iter_jsonl`) must either read a file completely or refuse it with an
InputError naming the file; it never yields a file's records with some
missing. The oracle is an independent reference parse of the same bytes:

- compressed files (gzip, zstd, bz2, xz) and Parquet: any truncation is refused;
- plain JSON lines and CSV: a truncation either fails naming the file or
  yields exactly the records the reference parse of the truncated bytes gives
  (a text file cut at a line boundary is a valid shorter file);
- corruption: the reader's result equals the reference's, and where the
  reference refuses the bytes (bad gzip/zstd data, broken JSON), the reader
  refuses them naming the file;
- invalid UTF-8 in JSON lines or CSV is refused naming the file and the
  1-based line (the token cache, with skip_bad_records, counts it as a bad record).

A seeded loop, so every failure reproduces: the case's seed is in the message.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import os
import random
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster.tokenize.records import BadRecord, read_records
from marin_dagster.zephyr.readers import InputError, iter_file_batches, iter_file_records

WORDS = [
    "to",
    "be",
    "or",
    "not",
    "café",
    "naïve",
    "日本語",
    "question",
    "whether",
    "tis",
    "nobler",
    "mind",
    "suffer",
    "slings",
    "arrows",
    "outrageous",
    "fortune",
]
FORMATS = [
    "jsonl",
    "jsonl.gz",
    "jsonl.zst",
    "parquet",
    "csv",
    "csv.gz",
    "jsonl.bz2",
    "jsonl.xz",
    "csv.zst",
]
COMPRESSED = (".gz", ".zst", ".bz2", ".xz")
MUTATIONS = ["none", "truncate", "truncate", "corrupt", "misencode"]
CASES = int(os.environ.get("READER_FUZZ_CASES", "3000"))


class Refused(Exception):
    """The reference parse refuses the bytes (at `line`, 1-based, where it has one)."""

    def __init__(self, reason: str, line: int | None = None):
        super().__init__(reason)
        self.line = line


# --- the reference: independent parses of the bytes --------------------------------


def ref_decompress(fmt: str, data: bytes) -> bytes:
    if fmt.endswith(COMPRESSED) and not data:
        raise Refused("an empty file is not a compressed stream (gzip -d refuses it too)")
    try:
        if fmt.endswith(".gz"):
            return gzip.decompress(data)
        if fmt.endswith(".bz2"):
            return bz2.decompress(data)
        if fmt.endswith(".xz"):
            return lzma.decompress(data)
        if fmt.endswith(".zst"):
            out, rest = [], data
            while True:  # frame by frame: each frame holds its content size
                params = zstandard.get_frame_parameters(rest)
                d = zstandard.ZstdDecompressor().decompressobj()
                out.append(d.decompress(rest))
                if not d.eof or (
                    params.content_size != zstandard.CONTENTSIZE_UNKNOWN
                    and len(out[-1]) != params.content_size
                ):
                    raise Refused("truncated zstd frame")
                rest = d.unused_data
                if not rest:
                    return b"".join(out)
    except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error, zstandard.ZstdError) as e:
        raise Refused(f"{type(e).__name__}: {e}") from None
    return data


def ref_jsonl_lines(text: bytes) -> list[tuple[int, object]]:
    """`(1-based line, record or Refused)` for each non-blank line."""
    out: list[tuple[int, object]] = []
    for lineno, line in enumerate(text.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            out.append((lineno, Refused(str(e), lineno)))
    return out


def ref_jsonl(text: bytes) -> list:
    records = []
    for lineno, rec in ref_jsonl_lines(text):
        if isinstance(rec, Refused):
            raise Refused("bad line", lineno)
        records.append(rec)
    return records


def ref_csv(data: bytes) -> list[dict]:
    for lineno, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused("invalid UTF-8", lineno) from None
    rows = [r for r in csv.reader(io.StringIO(data.decode("utf-8"), newline="")) if r]
    if not rows:
        return []
    header, body = rows[0], rows[1:]
    for r in body:
        if len(r) != len(header):
            raise Refused(f"{len(r)} fields, not {len(header)}")
    return [dict(zip(header, r, strict=True)) for r in body]


def ref_parquet(data: bytes) -> list[dict]:
    try:
        return pq.read_table(io.BytesIO(data)).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise Refused(str(e)) from None


# --- the cases ----------------------------------------------------------------------


def make_records(rng: random.Random) -> list[dict]:
    n = rng.randint(1, 30)
    return [
        {"id": i, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))}
        for i in range(n)
    ]


def encode(fmt: str, records: list[dict], rng: random.Random, misencode: bool) -> bytes:
    """The file's bytes; with `misencode`, one text value holds a Latin-1 byte."""
    if fmt == "parquet":
        sink = io.BytesIO()
        pq.write_table(
            pa.Table.from_pylist(records),
            sink,
            row_group_size=rng.choice([3, 7, 1000]),
            compression=rng.choice(["none", "snappy", "zstd"]),
        )
        return sink.getvalue()
    if fmt.startswith("jsonl"):
        lines = [json.dumps(r, ensure_ascii=False).encode() for r in records]
        if rng.random() < 0.3:  # blank lines: records are not lines
            for _ in range(rng.randint(1, 3)):
                lines.insert(rng.randint(0, len(lines)), b"")
    else:
        lines = [b"id,text"] + [f"{r['id']},{r['text']}".encode() for r in records]
    if misencode:
        k = rng.randrange(len(lines))
        while not lines[k] or lines[k] == b"id,text":
            k = rng.randrange(len(lines))
        cut = lines[k].rindex(b'"') if fmt.startswith("jsonl") else len(lines[k])
        lines[k] = lines[k][:cut] + rng.choice([b"\xe9", b"\xff", b"\xc3"]) + lines[k][cut:]
    raw = b"\n".join(lines) + b"\n"
    if fmt.endswith(".gz"):
        return gzip.compress(raw, mtime=0)
    if fmt.endswith(".bz2"):
        return bz2.compress(raw)
    if fmt.endswith(".xz"):
        return lzma.compress(raw)
    if fmt.endswith(".zst"):
        c = zstandard.ZstdCompressor(write_checksum=rng.random() < 0.5)
        if rng.random() < 0.3 and len(raw) > 2:  # two frames
            mid = rng.randint(1, len(raw) - 1)
            return c.compress(raw[:mid]) + c.compress(raw[mid:])
        return c.compress(raw)
    return raw


def frame_boundaries(data: bytes) -> set[int]:
    """Offsets where a zstd frame ends (a cut there is a valid file of fewer frames)."""
    ends, pos = set(), 0
    while pos < len(data):
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
        ends.add(pos)
    return ends - {len(data)}


def mutate(fmt: str, data: bytes, kind: str, rng: random.Random) -> bytes:
    if kind == "truncate":
        skip = frame_boundaries(data) if fmt.endswith(".zst") else set()
        while True:
            # Cut anywhere, but often within the last bytes (trailers, checksums, footers).
            cut = (
                rng.randrange(len(data))
                if rng.random() < 0.6
                else max(0, len(data) - rng.randint(1, 12))
            )
            if cut not in skip:
                return data[:cut]
    if kind == "corrupt":
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(out))
            if fmt == "csv":
                # Keep CSV's quoting and type inference out of it: digits and plain letters.
                out[i] = rng.choice(b"0123456789abcdfghijkmopqrsuvwxyz,\n")
            else:
                out[i] ^= 1 << rng.randrange(8)
        return bytes(out)
    return data


# --- what the readers give ----------------------------------------------------------


def read_zephyr(path: str) -> list:
    return list(iter_file_records(path, "auto"))


def read_zephyr_batches(path: str) -> list:
    return [r for b in iter_file_batches(path, "auto") for r in b.to_pylist()]


def read_tokenize(path: str) -> list[tuple[int, int | None, object]]:
    return list(read_records(path))


def outcome(fn, path: str):
    try:
        return fn(path)
    except InputError as e:
        return e


def csv_value(v: object) -> str:
    return "" if v is None else str(v)


def check_refusal(result: object, path: str, ref: Refused, where: str) -> None:
    assert isinstance(result, InputError), (
        f"{where}: the reference refuses the bytes ({ref}), the reader gave {result!r:.300}"
    )
    assert path in str(result), f"{where}: the error does not name the file: {result}"
    if ref.line is not None:
        assert f"line {ref.line}:" in str(result), f"{where}: not naming line {ref.line}: {result}"


def uniform(records: list) -> bool:
    """Records Arrow can hold as one table: objects whose fields keep one type."""
    types: dict[str, set] = {}
    for r in records:
        if not isinstance(r, dict):
            return False
        for k, v in r.items():
            if v is not None:
                types.setdefault(k, set()).add(type(v))
    return all(len(t) == 1 and t <= {int, str} for t in types.values())


def run_case(seed: int, tmp_path) -> None:
    rng = random.Random(seed)
    fmt = FORMATS[seed % len(FORMATS)]
    kind = rng.choice(MUTATIONS)
    if kind == "misencode" and fmt == "parquet":
        kind = "corrupt"
    records = make_records(rng)
    original = encode(fmt, records, rng, kind == "misencode")
    data = mutate(fmt, original, kind, rng)
    path = str(tmp_path / f"case-{seed}.{fmt}")
    with open(path, "wb") as f:
        f.write(data)
    where = f"seed {seed} ({fmt}, {kind}, {len(data)} of {len(original)} bytes)"
    compressed = fmt.endswith(COMPRESSED)
    must_refuse = kind == "truncate" and (compressed or fmt == "parquet")

    # The reference.
    ref: list | Refused
    try:
        if fmt == "parquet":
            ref = ref_parquet(data)
        else:
            text = ref_decompress(fmt, data)
            ref = ref_jsonl(text) if fmt.startswith("jsonl") else ref_csv(text)
    except Refused as e:
        ref = e
    if must_refuse:
        assert isinstance(ref, Refused), f"{where}: the reference reads a truncated file"
        ref.line = None  # the whole file is refused, at no line

    got = outcome(read_zephyr, path)
    got_batches = outcome(read_zephyr_batches, path)
    if isinstance(ref, Refused):
        check_refusal(got, path, ref, where + " records")
        check_refusal(got_batches, path, ref, where + " batches")
    elif fmt.startswith("csv"):
        for result, name in ((got, "records"), (got_batches, "batches")):
            assert not isinstance(result, InputError), f"{where} {name}: refused: {result}"
            assert [{k: csv_value(v) for k, v in r.items()} for r in result] == ref, (
                f"{where} {name}"
            )
    else:
        assert got == ref, f"{where}: the records differ from the reference's"
        if uniform(ref):
            assert not isinstance(got_batches, InputError), f"{where}: refused: {got_batches}"
            assert [{k: v for k, v in r.items() if v is not None} for r in got_batches] == [
                {k: v for k, v in r.items() if v is not None} for r in ref
            ], f"{where} batches"
    if kind == "none" and not fmt.startswith("csv"):
        assert got == records, where

    if fmt.startswith("csv"):
        return
    # The token cache's reader: bad lines are BadRecords (skippable), a bad file is refused.
    got_tok = outcome(read_tokenize, path)
    if fmt == "parquet" or must_refuse or (isinstance(ref, Refused) and ref.line is None):
        if isinstance(ref, Refused):
            check_refusal(got_tok, path, Refused(str(ref)), where + " tokenize")
        else:
            assert [r for _, _, r in got_tok] == ref, f"{where} tokenize"
        return
    expected = ref_jsonl_lines(ref_decompress(fmt, data))
    assert not isinstance(got_tok, InputError), f"{where} tokenize: refused: {got_tok}"
    assert [line for _, line, _ in got_tok] == [n for n, _ in expected], f"{where} tokenize lines"
    assert [i for i, _, _ in got_tok] == list(range(len(expected))), f"{where} tokenize index"
    for (_, _, rec), (_, want) in zip(got_tok, expected, strict=True):
        if isinstance(want, Refused):
            assert isinstance(rec, BadRecord), f"{where} tokenize: a bad line read as {rec!r}"
        else:
            assert rec == want, f"{where} tokenize"


@pytest.mark.parametrize("block", range(5))
def test_readers_never_lose_records(tmp_path, block: int) -> None:
    per_block = CASES // 5
    for seed in range(block * per_block, (block + 1) * per_block):
        run_case(seed, tmp_path)
