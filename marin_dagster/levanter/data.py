"""The training data: a weighted mixture of token caches, cut into packed sequences.

Batch `step` is a pure function of (datasets, weights, seed, seq_len, batch_size,
step), so a restarted run reads exactly the batch it would have read.

Example `i` of the mixture (i = step * batch_size + row) is placed like
Levanter's block-deterministic `MixtureDataset`: examples come in blocks of
`block_size`; each block holds a fixed count of each dataset (its weight's share,
largest remainder), in an order shuffled by (seed, block). The n-th example drawn
from a dataset is that cache's packed sequence at stream position n (epoch
n // num_sequences, each epoch in its own seeded permutation: the cache reader's
`sequence_order`).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from marin_dagster import fs
from marin_dagster.tokenize.cache import TokenCache, read_cache_stats

DEFAULT_BLOCK_SIZE = 2048


class TrainInputError(ValueError):
    """Training input that cannot be used (dataset, mixture weight, seq_len, vocab, ...); the message names the field."""


def check_token_ids(batch: np.ndarray, vocab_size: int, where: str) -> None:
    """Every id below the model's vocabulary size, else a TrainInputError naming the data."""
    top = int(batch.max())
    if top >= vocab_size:
        raise TrainInputError(
            f"{where}: token id {top} is outside the model's vocabulary (model.vocab_size={vocab_size}); "
            "the cache was built with a different tokenizer than the model's vocab_size says"
        )


def _sub_seed(seed: int, path: str) -> int:
    """A dataset's own seed. It keys on the cache's folder name ({name}-{version}), not the
    whole path, so the same run under another prefix (./data, gs://...) reads the same batches."""
    digest = hashlib.sha256(f"{seed}:{fs.basename(path)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def open_cache(path: str, split: str, field: str) -> TokenCache:
    try:
        return TokenCache.open(path, split=split)
    except (FileNotFoundError, RuntimeError) as e:
        raise TrainInputError(
            f"{field}: cannot open token cache {path!r} split {split!r}: {e}"
        ) from e


def bytes_per_token(path: str, split: str, cache: TokenCache) -> float | None:
    """Source UTF-8 bytes per token, from the ledger or the cache's .stats.json; None if unknown."""
    num_bytes = cache.num_bytes
    if not num_bytes:
        stats = read_cache_stats(fs.normalize(path)) or {}
        num_bytes = int((stats.get(split) or {}).get("num_bytes", 0))
    if not num_bytes or not cache.num_tokens:
        return None
    return num_bytes / cache.num_tokens


def block_counts(weights: list[float], block_size: int) -> np.ndarray:
    """Examples of each dataset per block: shares of `block_size`, at least one each."""
    total = sum(weights)
    exact = np.array([w / total * block_size for w in weights])
    counts = np.floor(exact).astype(np.int64)
    remainder = block_size - int(counts.sum())
    for k in np.argsort(-(exact - counts), kind="stable")[:remainder]:
        counts[k] += 1
    for k in np.nonzero(counts == 0)[0]:
        counts[k] = 1
        counts[int(np.argmax(counts))] -= 1
    return counts


class _EpochOrders:
    """The cache's per-epoch sequence orders, a few kept (batches rarely span more than two)."""

    def __init__(self, cache: TokenCache, seq_len: int, seed: int) -> None:
        self.cache, self.seq_len, self.seed = cache, seq_len, seed
        self.n = cache.num_sequences(seq_len)
        self._orders: OrderedDict[int, np.ndarray] = OrderedDict()

    def positions_to_sequences(self, positions: np.ndarray) -> np.ndarray:
        epochs, within = np.divmod(positions, self.n)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):
            e = int(epoch)
            if e not in self._orders:
                self._orders[e] = self.cache.sequence_order(self.seq_len, self.seed, e)
                while len(self._orders) > 3:
                    self._orders.popitem(last=False)
            mask = epochs == epoch
            out[mask] = self._orders[e][within[mask]]
        return out


@dataclass(frozen=True)
class MixtureComponent:
    path: str
    weight: float
    cache: TokenCache
    num_sequences: int


class MixtureDataset:
    """Packed `seq_len` sequences from `datasets` ({cache path: weight}), deterministic for `seed`."""

    def __init__(
        self,
        datasets: Mapping[str, float],
        seq_len: int,
        seed: int = 0,
        *,
        split: str = "train",
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        if not datasets:
            raise TrainInputError("datasets: no training dataset given; pass {cache_path: weight}")
        if block_size < len(datasets):
            raise TrainInputError(
                f"block_size ({block_size}) must be at least the number of datasets ({len(datasets)})"
            )
        self.seq_len, self.seed, self.block_size = seq_len, seed, block_size
        self.components: list[MixtureComponent] = []
        for path, weight in datasets.items():
            if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
                raise TrainInputError(
                    f"datasets[{path!r}]: mixture weight must be a positive number, got {weight!r}; "
                    "drop the dataset instead of giving it weight 0"
                )
            cache = open_cache(path, split, f"datasets[{path!r}]")
            n = cache.num_sequences(seq_len)
            if n == 0:
                raise TrainInputError(
                    f"datasets[{path!r}]: split {split!r} holds {cache.num_tokens} tokens, fewer than one "
                    f"sequence of seq_len={seq_len}; the dataset is empty or too small: give it "
                    "more documents, hold out less of it (a smaller validation fraction when "
                    "tokenizing) or train with a shorter seq_len"
                )
            self.components.append(MixtureComponent(path, float(weight), cache, n))
        self.counts = block_counts([c.weight for c in self.components], block_size)
        self._orders = [
            _EpochOrders(c.cache, seq_len, _sub_seed(seed, c.path)) for c in self.components
        ]
        self._layouts: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def _layout(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """For each slot of `block`: the dataset, and its rank among that dataset's slots."""
        if block not in self._layouts:
            labels = np.repeat(np.arange(len(self.components)), self.counts)
            rng = np.random.Generator(np.random.PCG64([self.seed, block]))
            labels = labels[rng.permutation(self.block_size)]
            ranks = np.empty(self.block_size, dtype=np.int64)
            for d in range(len(self.components)):
                slots = np.nonzero(labels == d)[0]
                ranks[slots] = np.arange(slots.size)
            self._layouts[block] = (labels, ranks)
            while len(self._layouts) > 4:
                self._layouts.popitem(last=False)
        return self._layouts[block]

    def examples(self, indices: np.ndarray) -> np.ndarray:
        """Mixture examples by global index, shape (len(indices), seq_len), int32."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((indices.size, self.seq_len), dtype=np.int32)
        blocks, slots = np.divmod(indices, self.block_size)
        which = np.empty_like(indices)
        position = np.empty_like(indices)
        for block in np.unique(blocks):
            mask = blocks == block
            labels, ranks = self._layout(int(block))
            which[mask] = labels[slots[mask]]
            position[mask] = int(block) * self.counts[labels[slots[mask]]] + ranks[slots[mask]]
        for d, comp in enumerate(self.components):
            rows = np.nonzero(which == d)[0]
            if rows.size:
                seqs = self._orders[d].positions_to_sequences(position[rows])
                out[rows] = comp.cache.sequences(seqs, self.seq_len)
        return out

    def batch(self, step: int, batch_size: int) -> np.ndarray:
        return self.examples(step * batch_size + np.arange(batch_size, dtype=np.int64))


@dataclass(frozen=True)
class EvalSet:
    name: str
    path: str
    cache: TokenCache
    num_sequences: int
    bytes_per_token: float | None


def open_eval_sets(
    validation: Mapping[str, str],
    seq_len: int,
    split: str,
    bytes_per_token_override: Mapping[str, float] | None = None,
) -> list[EvalSet]:
    """Validation sets ({name: cache path}); each must hold at least one sequence."""
    out = []
    for name, path in validation.items():
        cache = open_cache(path, split, f"validation[{name!r}]")
        n = cache.num_sequences(seq_len)
        if n == 0:
            raise TrainInputError(
                f"validation[{name!r}]: {path!r} split {split!r} holds {cache.num_tokens} tokens, fewer "
                f"than one sequence of seq_len={seq_len}: give the split more data (a larger "
                "validation fraction when tokenizing, or a validation dataset of its own) or "
                "validate on other token caches (train_lm's evals=[...])"
            )
        bpt = (bytes_per_token_override or {}).get(name) or bytes_per_token(path, split, cache)
        out.append(EvalSet(name, path, cache, n, bpt))
    return out


def eval_batches(
    eval_set: EvalSet, seq_len: int, batch_size: int, max_batches: int | None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tokens, row_mask) batches of the split's sequences in stream order.

    The last batch is padded to `batch_size` (row_mask 0 on the padding) so the
    compiled eval step sees one shape and every sequence is counted once.
    """
    n = eval_set.num_sequences
    n_batches = -(-n // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for b in range(n_batches):
        idx = np.arange(b * batch_size, (b + 1) * batch_size)
        valid = idx < n
        tokens = eval_set.cache.sequences(np.where(valid, idx, 0), seq_len)
        yield tokens, valid.astype(np.float32)
