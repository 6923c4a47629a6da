"""What loading the code location imports: Dagster and the factories, not the engines' heavy
libraries.

Every Dagster step runs in a fresh process that loads the code location first, and so does
each `dagster` and `marin` command. JAX, optax and orbax (training), scipy (the LSH parameter
search) and the Kubernetes client took 2 of the 3.3 s of that load; they now load in the step
that uses them.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import subprocess_env

HEAVY = ("jax", "optax", "orbax", "tensorstore", "scipy", "kubernetes", "dagster_k8s", "ray")

LOAD = """
import json, sys
import marin_dagster.definitions
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_loading_the_definitions_imports_no_engine_library():
    proc = subprocess.run(
        [sys.executable, "-c", LOAD],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "dagster" in loaded  # the load itself happened
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_levanter_names_resolve_to_the_same_objects_after_their_modules_load():
    """The package's names resolve lazily; a module loaded later must not shadow one (a
    submodule named like a function it exports would replace it on the package)."""
    import marin_dagster.levanter as levanter
    from marin_dagster.levanter import evaluation, trainer

    assert levanter.evaluate is evaluation.evaluate
    assert levanter.train is trainer.train
    for name in levanter.__all__:
        assert not isinstance(getattr(levanter, name), type(sys)), name
