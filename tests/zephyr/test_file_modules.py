"""Functions from a file loaded by path, as `dagster dev -f exp.py` loads an experiment."""

from __future__ import annotations

import importlib.util
import sys
import uuid

import cloudpickle

from marin_dagster.zephyr import Dataset, ZephyrContext

EXPERIMENT = """
import dataclasses

from marin_dagster.zephyr import get_shared

SUFFIX = "!"


@dataclasses.dataclass
class Style:
    mark: str


def _suffix(text):
    return text + SUFFIX + get_shared("style").mark


def shout(record):
    return {**record, "text": _suffix(record["text"].upper())}
"""


def test_a_function_from_a_file_loaded_by_path_runs_in_the_workers(
    tmp_path, any_ctx: ZephyrContext
) -> None:
    """Dagster loads `-f exp.py` as a top-level module whose folder is not on sys.path, so
    a worker (whose import path is the driver's) cannot import it by name: its functions
    and classes travel by value, with the module's helpers and constants they use, in
    tasks and in shared objects. Modules a worker can import stay by reference."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    name = f"exp_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(EXPERIMENT)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    try:
        ds = Dataset.from_list([{"text": "to be"}, {"text": "or not"}]).reshard(2).map(module.shout)
        # a shared object whose class the file defines travels by value too
        any_ctx.put("style", module.Style("?"))
        out = any_ctx.execute(ds).results
        assert sorted(r["text"] for r in out) == ["OR NOT!?", "TO BE!?"]
        registered = cloudpickle.list_registry_pickle_by_value()
        assert name in registered
        assert not {"json", "pyarrow", "marin_dagster", "cloudpickle"} & registered
    finally:
        del sys.modules[name]
        cloudpickle.unregister_pickle_by_value(module)
