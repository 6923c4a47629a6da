"""The data mixture over real token caches (written with the tokenize engine's writer)."""

from __future__ import annotations

import numpy as np
import pytest

from marin_dagster.levanter import MixtureDataset, TrainInputError
from marin_dagster.levanter.data import block_counts, open_eval_sets
from marin_dagster.tokenize.cache import TokenCache
from tests.levanter.caches import write_cache

SEQ = 16


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("caches")
    return {
        "a": write_cache(str(root / "a"), 50, 4000, seed=1, validation_tokens=500),
        "b": write_cache(str(root / "b"), 50, 2400, seed=2, shards=3),
        "tiny": write_cache(str(root / "tiny"), 50, 10, seed=3, shards=1),
    }


def test_a_batch_is_a_pure_function_of_seed_and_step(caches: dict[str, str]) -> None:
    mix = {caches["a"]: 1.0, caches["b"]: 0.5}
    first = MixtureDataset(mix, SEQ, seed=7)
    batches = [first.batch(step, 8) for step in range(30)]
    # A fresh dataset (as after a restart) asked for step 17 directly gives the same batch.
    again = MixtureDataset(mix, SEQ, seed=7)
    for step in (17, 3, 29, 0):
        np.testing.assert_array_equal(again.batch(step, 8), batches[step])
    other_seed = MixtureDataset(mix, SEQ, seed=8).batch(0, 8)
    assert not np.array_equal(other_seed, batches[0])
    assert all(b.shape == (8, SEQ) and b.dtype == np.int32 for b in batches)


def test_batches_do_not_depend_on_where_the_caches_live(caches: dict[str, str], tmp_path) -> None:
    """The same caches under another prefix (a copy, as on gs:// vs ./data) give the same batches."""
    import shutil

    moved = {k: shutil.copytree(caches[k], tmp_path / "elsewhere" / k) for k in ("a", "b")}
    here = MixtureDataset({caches["a"]: 1.0, caches["b"]: 0.5}, SEQ, seed=7)
    there = MixtureDataset({str(moved["a"]): 1.0, str(moved["b"]): 0.5}, SEQ, seed=7)
    for step in (0, 5, 40):
        np.testing.assert_array_equal(here.batch(step, 8), there.batch(step, 8))


def test_mixture_follows_the_weights(caches: dict[str, str]) -> None:
    a, b = TokenCache.open(caches["a"]), TokenCache.open(caches["b"])
    seqs_a = {tuple(s) for s in a.sequences(np.arange(a.num_sequences(SEQ)), SEQ)}
    seqs_b = {tuple(s) for s in b.sequences(np.arange(b.num_sequences(SEQ)), SEQ)}
    ds = MixtureDataset({caches["a"]: 1.0, caches["b"]: 0.5}, SEQ, seed=0, block_size=96)
    rows = ds.examples(np.arange(960))
    from_a = sum(tuple(r) in seqs_a for r in rows)
    from_b = sum(tuple(r) in seqs_b for r in rows)
    assert from_a + from_b == 960
    assert (from_a, from_b) == (640, 320)  # 2:1 in every block of 96


def test_one_epoch_visits_every_sequence_once(caches: dict[str, str]) -> None:
    cache = TokenCache.open(caches["b"])
    n = cache.num_sequences(SEQ)
    ds = MixtureDataset({caches["b"]: 1.0}, SEQ, seed=3, block_size=64)
    epoch = ds.examples(np.arange(n))
    expected = cache.sequences(np.arange(n), SEQ)
    assert sorted(map(tuple, epoch)) == sorted(map(tuple, expected))
    # The next epoch is another order of the same sequences.
    nxt = ds.examples(np.arange(n, 2 * n))
    assert sorted(map(tuple, nxt)) == sorted(map(tuple, expected))
    assert not np.array_equal(nxt, epoch)


def test_block_counts_give_every_dataset_a_share() -> None:
    assert list(block_counts([1.0, 0.5], 2048)) == [1365, 683]
    assert list(block_counts([1000.0, 1.0], 16)) == [15, 1]
    assert block_counts([0.3, 0.3, 0.4], 10).sum() == 10


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan")])
def test_non_positive_weight_names_the_dataset(caches: dict[str, str], weight: float) -> None:
    with pytest.raises(
        TrainInputError, match=r"datasets\[.*b'\]: mixture weight must be a positive"
    ):
        MixtureDataset({caches["a"]: 1.0, caches["b"]: weight}, SEQ)


def test_empty_or_missing_dataset_is_named(caches: dict[str, str], tmp_path) -> None:
    with pytest.raises(
        TrainInputError, match=r"datasets\[.*tiny'\].*fewer than one sequence of seq_len=16"
    ):
        MixtureDataset({caches["tiny"]: 1.0}, SEQ)
    with pytest.raises(TrainInputError, match=r"datasets\[.*nowhere'\]: cannot open token cache"):
        MixtureDataset({str(tmp_path / "nowhere"): 1.0}, SEQ)
    with pytest.raises(TrainInputError, match="no training dataset"):
        MixtureDataset({}, SEQ)


def test_eval_sets_know_bytes_per_token(caches: dict[str, str]) -> None:
    (es,) = open_eval_sets({"a": caches["a"]}, SEQ, "validation")
    assert es.bytes_per_token == pytest.approx(3.5, rel=0.05)
    (over,) = open_eval_sets({"a": caches["a"]}, SEQ, "validation", {"a": 2.0})
    assert over.bytes_per_token == 2.0
    with pytest.raises(TrainInputError, match=r"validation\['b'\]"):
        open_eval_sets({"b": caches["b"]}, SEQ, "validation")


def test_a_validation_split_under_one_sequence_says_what_to_do(tmp_path) -> None:
    small = write_cache(str(tmp_path / "small"), 50, 400, seed=4, validation_tokens=SEQ - 1)
    with pytest.raises(TrainInputError, match=r"fewer than one sequence of seq_len=16: .*evals="):
        open_eval_sets({"small": small}, SEQ, "validation")
