"""Data-parallel and FSDP training over 4 (host-platform) CPU devices match 1-device training."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import subprocess_env
from tests.levanter.caches import write_cache

VOCAB = 50


@pytest.mark.slow
def test_four_devices_match_one(tmp_path) -> None:
    data = write_cache(str(tmp_path / "cache"), VOCAB, 6000, period=5)
    spec = {
        "datasets": {data: 1.0},
        "steps": 8,
        "vocab": VOCAB,
        "checkpoint_every_steps": 8,
        "log_every": 8,
        "runs": [
            {"output": str(tmp_path / "one"), "num_devices": 1},
            {"output": str(tmp_path / "dp"), "parallelism": "data_parallel"},
            {"output": str(tmp_path / "fsdp"), "parallelism": "fsdp"},
        ],
    }
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.levanter.train_job", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, dp, fsdp = (json.loads(line) for line in proc.stdout.strip().splitlines()[-3:])
    assert one["devices"] == 4
    assert [r["result"]["num_devices"] for r in (one, dp, fsdp)] == [1, 4, 4]
    reference = np.array(one["losses"])
    assert len(reference) == 8 and reference[-1] < reference[0]
    for other in (dp, fsdp):
        np.testing.assert_allclose(np.array(other["losses"]), reference, rtol=1e-5)
    a = np.load(tmp_path / "one" / "params.npz")
    b = np.load(tmp_path / "fsdp" / "params.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-3, atol=1e-5)


def test_fsdp_shards_the_largest_divisible_non_layer_dimension() -> None:
    from jax.sharding import PartitionSpec as P
    from jax.tree_util import DictKey

    from marin_dagster.levanter.mesh import _fsdp_spec

    layers = (DictKey("layers"), DictKey("q_proj"))
    assert _fsdp_spec(layers, (2, 32, 64), 4) == P(None, None, "data")
    assert _fsdp_spec(layers, (4, 30, 30), 4) == P()  # the layer axis is never split
    assert _fsdp_spec((DictKey("token_embedding"),), (50, 32), 4) == P(None, "data")
    assert _fsdp_spec((DictKey("final_norm"),), (32,), 1) == P()
