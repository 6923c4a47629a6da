"""Every Iris setting is declared once (marin_dagster/iris/settings.py) and reachable both
from IrisResource and from the executor's run config, with the same value arriving."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import pytest
from dagster import Shape
from dagster._config import process_config

from marin_dagster.iris.executor import IRIS_EXECUTOR_CONFIG_SCHEMA, settings_from_executor_config
from marin_dagster.iris.settings import IrisSettings
from marin_dagster.settings import field_default, settings_fields, unwrap_optional
from resources.iris import IrisResource


def _other_value(name: str, tp: Any, default: Any) -> Any:
    """A value of type `tp` different from `default` (JSON-ready, as config is written)."""
    inner, _ = unwrap_optional(tp)
    if name == "launcher":
        return "kubernetes"
    if inner is bool:
        return not default
    if inner is int:
        return (default or 0) + 3
    if inner is float:
        return (default or 0.0) + 1.5
    if inner is str:
        return f"set-{name}"
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin is tuple:
        return [{"name": f"set-{name}"}] if args[0] is not str else [f"set-{name}", "b"]
    if origin in (Mapping, dict):
        return {"K": "secret:key"} if args[1] is str else {"pod_spec_config": {"n": 1}}
    raise AssertionError(f"no test value for {name}: {tp}")


def _leaves(cls: type, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for f, tp in settings_fields(cls):
        inner, _ = unwrap_optional(tp)
        if dataclasses.is_dataclass(inner):
            out += _leaves(inner, (*path, f.name))
        else:
            out.append(((*path, f.name), _other_value(f.name, tp, field_default(f))))
    return out


LEAVES = _leaves(IrisSettings)


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    return {path[0]: value} if len(path) == 1 else {path[0]: _nest(path[1:], value)}


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


def test_the_settings_have_leaves_in_both_nested_groups():
    paths = {p for p, _ in LEAVES}
    assert ("sleep_seconds",) in paths and ("kubernetes", "step_k8s_config") in paths
    assert ("inventory", "gpus") in paths and len(paths) >= 30


@pytest.mark.parametrize("path, value", LEAVES, ids=[".".join(p) for p, _ in LEAVES])
def test_every_setting_reaches_the_executor_from_the_resource_and_from_run_config(path, value):
    resource = IrisResource.model_validate(_nest(path, value))
    from_resource = resource.settings()
    expected = tuple(value) if isinstance(value, list) else value
    assert _get(from_resource, path) == expected
    # the same setting written in the executor's run config, through Dagster's own processing
    processed = process_config(Shape(IRIS_EXECUTOR_CONFIG_SCHEMA), _nest(path, value))
    assert processed.success, processed.errors
    assert settings_from_executor_config(processed.value) == from_resource
    # and the resource's executor block is valid executor config
    assert process_config(Shape(IRIS_EXECUTOR_CONFIG_SCHEMA), resource.executor_config()).success


def test_defaults_agree():
    processed = process_config(Shape(IRIS_EXECUTOR_CONFIG_SCHEMA), {})
    assert (
        settings_from_executor_config(processed.value)
        == IrisResource().settings()
        == IrisSettings()
    )


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match="sleep_secs"):
        IrisSettings.from_dict({"sleep_secs": 1})


def test_the_listed_gpus_type_comes_from_the_environment(monkeypatch) -> None:
    """MARIN_IRIS_GPUS listed GPUs of any type: a step asking for gpu:a100 ran on whatever
    was listed, and no environment variable could say what they were."""
    from resources.iris import IrisResource

    monkeypatch.setenv("MARIN_IRIS_GPUS", "0,1")
    monkeypatch.setenv("MARIN_IRIS_GPU_TYPE", "h100")
    inventory = IrisResource.from_env().settings().inventory.local_inventory()
    assert [(d.kind, d.id, d.variant) for d in inventory.devices] == [
        ("gpu", "0", "h100"),
        ("gpu", "1", "h100"),
    ]
    monkeypatch.setenv("MARIN_IRIS_GPU_TYPE", "h1000")
    with pytest.raises(Exception, match=r"gpu_type='h1000' is unknown; known GPU types: "):
        IrisResource.from_env().settings().inventory.local_inventory()
