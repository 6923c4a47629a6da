"""LSH banding: parameters from a Jaccard threshold, band bucket keys, saved signature sets.

`optimal_param` is datasketch's `MinHashLSH` parameter search, reimplemented
term for term (the same scipy integrals and grid order, so the same
`(bands, rows)`; a test holds them equal): the `(b, r)` with `b * r <=
num_perm` minimizing the weighted false-positive and false-negative areas
under the S-curve `1 - (1 - s^r)^b`.

A band's bucket key (`band_hashes`) folds the band's values with splitmix64
from a per-band seed, vectorized over documents: 64 bits, so equal values
in different bands never meet and distinct bands collide with probability
about 2^-64 per pair.

Saved signature set: Parquet with columns `id` (the document id as a string)
and `signature`
(`fixed_size_list<uint32>[num_perm]`), and the MinHash parameters in the
schema metadata under `dupekit` (JSON: num_perm, seed, shingle kind and n,
bands, rows). `load_minhash_lsh` turns one or more such files into a
datasketch `MinHashLSH` to query new documents against.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.dupekit.text import replace_unencodable

_META_KEY = b"dupekit"


def _false_positive_area(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad

    area, _err = quad(lambda s: 1 - (1 - s ** float(r)) ** float(b), 0.0, threshold)
    return area


def _false_negative_area(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad

    area, _err = quad(lambda s: 1 - (1 - (1 - s ** float(r)) ** float(b)), threshold, 1.0)
    return area


@functools.lru_cache(maxsize=64)
def optimal_param(
    threshold: float, num_perm: int, weights: tuple[float, float] = (0.5, 0.5)
) -> tuple[int, int]:
    """`(bands, rows)` for a Jaccard threshold, as datasketch's `MinHashLSH` picks them."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    fp_weight, fn_weight = weights
    min_error = float("inf")
    opt = (0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, int(num_perm / b) + 1):
            error = (
                _false_positive_area(threshold, b, r) * fp_weight
                + _false_negative_area(threshold, b, r) * fn_weight
            )
            if error < min_error:
                min_error = error
                opt = (b, r)
    return opt


@dataclass(frozen=True)
class LSHParams:
    bands: int
    rows: int

    @classmethod
    def resolve(
        cls, num_perm: int, threshold: float, bands: int | None = None, rows: int | None = None
    ) -> LSHParams:
        """Given bands and rows, checked; else chosen from `threshold`."""
        if (bands is None) != (rows is None):
            raise ValueError(
                "give both bands and rows, or neither (they are then chosen "
                f"from threshold={threshold}); got bands={bands}, rows={rows}"
            )
        if bands is None:
            bands, rows = optimal_param(float(threshold), num_perm)
        if bands < 1 or rows < 1 or bands * rows > num_perm:
            raise ValueError(
                f"bands={bands} x rows={rows} must be positive and use at most "
                f"num_perm={num_perm} signature values"
            )
        return cls(bands, rows)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def band_hashes(signatures: np.ndarray, params: LSHParams) -> np.ndarray:
    """`[n, bands]` uint64 bucket keys: band i's `rows` values folded with splitmix64.

    Each band starts from its own seed, so equal values in different bands
    never share a bucket; two documents share band i's bucket exactly when
    their values in that band are equal (up to 64-bit collisions).
    """
    sigs = np.asarray(signatures, dtype=np.uint32).astype(np.uint64)
    out = np.empty((sigs.shape[0], params.bands), dtype=np.uint64)
    for band in range(params.bands):
        seed = (int(_GOLDEN) * (band + 1)) & 0xFFFFFFFFFFFFFFFF
        h = np.full(sigs.shape[0], seed, dtype=np.uint64)
        for col in range(band * params.rows, (band + 1) * params.rows):
            h = _splitmix64(h ^ sigs[:, col])
        out[:, band] = h
    return out


def write_signatures(
    path: str, ids: Sequence[Any], signatures: np.ndarray, meta: dict[str, Any]
) -> None:
    """A saved signature set (Parquet, atomic)."""
    sigs = np.ascontiguousarray(signatures, dtype=np.uint32)
    num_perm = sigs.shape[1] if sigs.ndim == 2 else int(meta["num_perm"])
    values = pa.array(sigs.reshape(-1), type=pa.uint32())
    table = pa.table(
        {
            # Arrow strings are UTF-8: an id's lone surrogates are saved as U+FFFD.
            "id": pa.array([replace_unencodable(str(i)) for i in ids], pa.string()),
            "signature": pa.FixedSizeListArray.from_arrays(values, num_perm),
        }
    )
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    with fs.atomic_write(path, "wb") as f:
        pq.write_table(table, f)


def _expand(path: str) -> list[str]:
    if not any(c in path for c in "*?["):
        return [path]
    filesystem, fs_path = fs.url_to_fs(path)
    protocol = path.split("://", 1)[0] + "://" if "://" in path else ""
    found = [protocol + p if protocol else p for p in sorted(filesystem.glob(fs_path))]
    if not found:
        raise FileNotFoundError(f"no signature files match {path!r}")
    return found


def read_signatures(paths: str | Iterable[str]) -> tuple[list[Any], np.ndarray, dict[str, Any]]:
    """`(ids, signatures [n, num_perm] uint32, meta)` of one or more saved signature files."""
    if isinstance(paths, str):
        paths = _expand(paths)
    ids: list[Any] = []
    blocks = []
    meta: dict[str, Any] | None = None
    for path in paths:
        fsys, p = fs.url_to_fs(path)
        with fsys.open(p, "rb") as f:
            table = pq.read_table(f)
        raw = (table.schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise ValueError(
                f"{path}: not a dupekit signature file (no '{_META_KEY.decode()}' "
                "schema metadata); write it with write_signatures"
            )
        this_meta = json.loads(raw)
        if meta is not None and this_meta != meta:
            raise ValueError(
                f"{path}: MinHash parameters {this_meta} differ from the other "
                f"files' {meta}; signatures of different parameters cannot be mixed"
            )
        meta = this_meta
        ids.extend(table.column("id").to_pylist())
        column = table.column("signature").combine_chunks()
        blocks.append(column.flatten().to_numpy().reshape(len(table), -1).astype(np.uint32))
    if meta is None:
        raise ValueError("read_signatures needs at least one file")
    num_perm = int(meta["num_perm"])
    sigs = np.concatenate(blocks) if blocks else np.zeros((0, num_perm), np.uint32)
    return ids, sigs, meta


def load_minhash_lsh(
    paths: str | Iterable[str],
    threshold: float | None = None,
    params: tuple[int, int] | None = None,
):  # -> datasketch.MinHashLSH
    """A datasketch `MinHashLSH` holding a saved signature set.

    Without `threshold` or `params` the index uses the bands and rows the set
    was deduplicated with.
    """
    from datasketch import MinHash, MinHashLSH

    from marin_dagster.dupekit.minhash import permutations

    ids, sigs, meta = read_signatures(paths)
    num_perm, seed = int(meta["num_perm"]), int(meta["seed"])
    if threshold is not None:
        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, params=params)
    else:
        lsh = MinHashLSH(
            num_perm=num_perm, params=params or (int(meta["bands"]), int(meta["rows"]))
        )
    perms = np.array(permutations(num_perm, seed))
    with lsh.insertion_session() as session:
        for doc_id, sig in zip(ids, sigs, strict=True):
            session.insert(
                doc_id, MinHash(seed=seed, hashvalues=sig, permutations=perms, scheme="affine32")
            )
    return lsh
