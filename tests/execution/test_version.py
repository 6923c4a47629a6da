"""Versions: what goes into the hash and what does not."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from marin_dagster.execution.version import (
    ADDED_LATER,
    StepConfig,
    added_later,
    canonical,
    compute_version,
    unversioned,
)


class Config(StepConfig):
    vocab_size: int = 8192
    lowercase: bool = False
    max_workers: int = unversioned(4)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    learning_rate: float = 6e-4
    weight_decay: float = 0.1


class TrainConfig(StepConfig):
    optimizer: Optimizer = Optimizer()
    steps: int = 10


def test_version_is_short_hex_and_stable():
    v = compute_version("tokenizer", Config())
    assert len(v) == 8 and int(v, 16) >= 0
    assert v == compute_version("tokenizer", Config())
    # stable across processes and releases: pinned for the default config
    assert v == compute_version("tokenizer", {"vocab_size": 8192, "lowercase": False})


def test_unversioned_fields_do_not_change_the_version():
    assert compute_version("k", Config(max_workers=1)) == compute_version(
        "k", Config(max_workers=64)
    )


class ConfigWithANewField(StepConfig):
    vocab_size: int = 8192
    lowercase: bool = False
    max_workers: int = unversioned(4)
    skip_bad_records: bool = added_later(False)


def test_a_field_added_later_keeps_old_versions_at_its_default():
    """Steps built before the field existed are not redone; a new value is a new version."""
    assert compute_version("k", ConfigWithANewField()) == compute_version("k", Config())
    changed = compute_version("k", ConfigWithANewField(skip_bad_records=True))
    assert changed != compute_version("k", Config())


@dataclasses.dataclass(frozen=True)
class TrainConfigWithANewField:
    learning_rate: float = 3e-4
    steps: int = 100
    compute_dtype: str = dataclasses.field(default="float32", metadata=ADDED_LATER)


@dataclasses.dataclass(frozen=True)
class OldTrainConfig:
    learning_rate: float = 3e-4
    steps: int = 100


def test_a_dataclass_field_added_later_keeps_old_versions_at_its_default():
    old = compute_version("train", OldTrainConfig())
    assert compute_version("train", TrainConfigWithANewField()) == old
    assert compute_version("train", TrainConfigWithANewField(compute_dtype="bfloat16")) != old


def test_every_versioned_field_and_input_changes_the_version():
    base = compute_version("k", Config())
    assert compute_version("k", Config(vocab_size=1024)) != base
    assert compute_version("k", Config(lowercase=True)) != base
    assert compute_version("other", Config()) != base
    assert compute_version("k", Config(), {"source": "abcd1234"}) != base
    assert compute_version("k", Config(), {"source": "abcd1234"}) != compute_version(
        "k", Config(), {"source": "abcd1235"}
    )


def test_nested_dataclasses_are_versioned_by_value():
    base = compute_version("train", TrainConfig())
    assert compute_version("train", TrainConfig(optimizer=Optimizer(learning_rate=1e-3))) != base
    assert compute_version("train", TrainConfig(optimizer=Optimizer())) == base


def test_canonical_orders_mappings_and_sets():
    assert canonical({"b": 1, "a": {2, 1}}) == {"a": [1, 2], "b": 1}
    with pytest.raises(TypeError, match="cannot version a value of type object") as err:
        canonical(object())
    assert str(err.value).endswith(
        "versioned values are JSON-like (str, int, float, bool, None, lists, dicts, dataclasses, pydantic models)"
    )
    # a set of mixed types raised Python's "'<' not supported between 'str' and 'int'"
    with pytest.raises(TypeError, match=r"cannot version the set .*mixed types.*use a list"):
        canonical({1, "a"})


def test_config_errors_name_the_field():
    with pytest.raises(pydantic.ValidationError, match="vocab_sise"):
        Config(vocab_sise=3)
    with pytest.raises(pydantic.ValidationError, match="vocab_size"):
        Config(vocab_size="big")
