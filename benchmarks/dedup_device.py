"""Signatures on JAX's device (packed.py) against the host path, from raw text.

For char and word 5-grams on generated prose documents of about 2 KB (and on
short records of about 200 bytes), best of --rounds, interleaved:

- host path: `HostSigner` (numpy shingle hashing, then the MinHash kernel),
- device path: `PackedSigner` from raw text (normalize and pack on the host,
  hash and sign on the device, the next chunk packed while the device works),
- the device's part alone: the same buffers packed and moved to the device
  beforehand, only the jitted program timed,

and checks that both paths give the same signatures bit for bit. Then
verification (verify.py), host against device: the exact intersections of
--pairs doubtful pairs of near-copy shingle hash sets (~2k hashes each, about
what a 2 KB document has), and the signature agreements of the pairs sharing
LSH buckets (in blocks, as a bucket partition is compared). Where JAX's
backend is the CPU the device path is the slower one (it is laid out for a
GPU; `DUPEKIT_COMPUTE=auto` keeps the host path there), so read its CPU
figures as a check that it runs, not as a goal.

Needs only JAX and numpy (not Dagster), so it runs on a bare GPU machine:

    PYTHONPATH=. python3 benchmarks/dedup_device.py --docs 200000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from marin_dagster.dupekit.packed import PackedSigner  # noqa: E402
from marin_dagster.dupekit.shingles import ShingleConfig  # noqa: E402
from marin_dagster.dupekit.signers import HostSigner  # noqa: E402
from marin_dagster.dupekit.verify import DeviceVerifier, HostVerifier  # noqa: E402


def generated(n_docs: int, chars: int, seed: int = 0) -> list[str]:
    """Prose-like documents: Zipf-distributed words of a 20k vocabulary, sentences of
    5-25 words with capitals and punctuation, about `chars` characters each."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1.0 / np.arange(1, 27)
    vocab = [
        "".join(rng.choice(letters, size=int(k), p=weights / weights.sum()))
        for k in rng.integers(1, 11, 20_000)
    ]
    rank = 1.0 / np.arange(1, len(vocab) + 1)
    words = rng.choice(len(vocab), size=n_docs * (chars // 5 + 8), p=rank / rank.sum())
    marks = [".", ".", ".", "?", "!", ";"]
    out, at = [], 0
    py = random.Random(seed)
    for _ in range(n_docs):
        parts, length = [], 0
        while length < chars:
            k = py.randint(5, 25)
            sentence = " ".join(vocab[w] for w in words[at : at + k])
            at = (at + k) % (len(words) - 32)
            sentence = sentence[:1].upper() + sentence[1:] + py.choice(marks)
            parts.append(sentence)
            length += len(sentence) + 1
        out.append(" ".join(parts))
    return out


def best_of(rounds: int, fns: dict) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():  # interleaved
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def device_only(signer: PackedSigner, texts: list[str]):
    """The buffers of `texts` on the device, and a call that runs the program over them."""
    on_device = [
        dataclasses.replace(
            b,
            flat=jax.device_put(b.flat),
            offsets=jax.device_put(b.offsets),
            lengths=jax.device_put(b.lengths),
        )
        for b in signer.buffers(texts)
    ]
    for b in on_device:  # compile every shape first
        jax.block_until_ready(signer.run(b))

    def run() -> None:
        jax.block_until_ready([signer.run(b) for b in on_device])

    return run


def near_copy_sets(pairs: int, size: int, seed: int = 3) -> tuple[list, list]:
    """Pairs of sorted uint32 sets of about `size` hashes sharing 70-100% of them."""
    rng = np.random.default_rng(seed)
    lefts, rights = [], []
    for _ in range(pairs):
        left = np.unique(rng.integers(0, 2**32, size=size, dtype=np.uint64)).astype(np.uint32)
        kept = left[rng.random(len(left)) < rng.uniform(0.7, 1.0)]
        fresh = rng.integers(0, 2**32, size=len(left) - len(kept), dtype=np.uint64)
        lefts.append(left)
        rights.append(np.union1d(kept, fresh.astype(np.uint32)).astype(np.uint32))
    return lefts, rights


def bench_verification(pairs: int, rounds: int) -> None:
    host, device = HostVerifier(), DeviceVerifier()
    lefts, rights = near_copy_sets(pairs, 2000)
    same = np.array_equal(host.intersections(lefts, rights), device.intersections(lefts, rights))
    t = best_of(
        rounds,
        {
            "host": lambda: host.intersections(lefts, rights),
            "device": lambda: device.intersections(lefts, rights),
        },
    )
    print(f"\nexact check, {pairs:,} pairs of ~2k-hash sets (intersections equal: {same})")
    for name in ("host", "device"):
        print(f"    {name} path  {pairs / t[name]:>12,.0f} pairs/s")
    print(f"    device / host path: {t['host'] / t['device']:.2f}x")
    # A bucket partition: 50k signatures in buckets of 2-4, 64k-pair blocks.
    rng = np.random.default_rng(4)
    sigs = rng.integers(0, 2**32, size=(50_000, 128), dtype=np.uint64).astype(np.uint32)
    a = rng.integers(0, len(sigs), size=pairs * 8)
    b = rng.integers(0, len(sigs), size=pairs * 8)
    blocks = [(a[i : i + 65536], b[i : i + 65536]) for i in range(0, len(a), 65536)]

    def agree(v) -> list:
        return [x[2] for x in v.agreements(sigs, blocks)]

    same_agree = all(np.array_equal(x, y) for x, y in zip(agree(host), agree(device), strict=True))
    t = best_of(rounds, {"host": lambda: agree(host), "device": lambda: agree(device)})
    print(f"signature agreements, {len(a):,} pairs (equal: {same_agree})")
    for name in ("host", "device"):
        print(f"    {name} path  {len(a) / t[name]:>12,.0f} pairs/s")
    print(f"    device / host path: {t['host'] / t['device']:.2f}x")
    if not (same and same_agree):
        raise SystemExit("the device path's verification differs from the host path's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000, help="documents of ~2 KB")
    ap.add_argument("--records", type=int, default=100_000, help="records of ~200 B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="char,word")
    ap.add_argument("--pairs", type=int, default=20_000, help="doubtful pairs to check")
    args = ap.parse_args()
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}: {jax.devices()}")
    corpora = {
        "documents (~2 KB)": generated(args.docs, 2000, seed=1),
        "records (~200 B)": generated(args.records, 200, seed=2),
    }
    for name, texts in corpora.items():
        size = sum(map(len, texts)) / len(texts)
        print(f"\n{name}: {len(texts)} texts, {size:.0f} characters each on average")
        for kind in args.kinds.split(","):
            config = ShingleConfig(kind, 5)
            host, device = HostSigner(config), PackedSigner(config)
            warm = texts[: min(len(texts), 4000)]
            host.signatures(warm)
            device.signatures(texts)  # compiles every width the corpus has
            check = texts[:2000]
            same = np.array_equal(host.signatures(check)[1], device.signatures(check)[1])
            kernel = device_only(device, texts)
            t = best_of(
                args.rounds,
                {
                    "host": lambda h=host, x=texts: h.signatures(x),
                    "device": lambda d=device, x=texts: d.signatures(x),
                    "kernel": kernel,
                },
            )
            rate = {k: len(texts) / v for k, v in t.items()}
            print(f"  {kind} 5-grams (signatures equal on 2,000 texts: {same})")
            print(f"    host path, from raw text     {rate['host']:>12,.0f} docs/s")
            print(f"    device path, from raw text   {rate['device']:>12,.0f} docs/s")
            print(f"    device program alone         {rate['kernel']:>12,.0f} docs/s")
            print(f"    device / host path: {rate['device'] / rate['host']:.2f}x")
            if not same:
                raise SystemExit("the device path's signatures differ from the host path's")
    bench_verification(args.pairs, args.rounds)


if __name__ == "__main__":
    main()
