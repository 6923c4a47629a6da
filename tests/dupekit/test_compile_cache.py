"""dupekit's on-disk cache of compiled kernels stays under its cap, oldest entries first.

Each case runs in a fresh interpreter: JAX reads the cache settings once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import jax, jax.numpy as jnp, numpy as np
    from marin_dagster.dupekit import minhash

    minhash.CACHE_MAX_BYTES = int(sys.argv[1])
    minhash.use_compilation_cache()
    folder = jax.config.jax_compilation_cache_dir
    names = []
    for n in range(1, 9):  # eight programs, compiled in this order
        jax.jit(lambda x, n=n: jnp.cumsum(x * n) + n)(np.arange(16 * n, dtype=np.float32)).block_until_ready()
        names.append(sorted(f for f in os.listdir(folder) if f.endswith("-cache")))
    entries = {f: os.path.getsize(os.path.join(folder, f)) for f in names[-1]}
    print(json.dumps({"folder": folder, "entries": entries, "after_each": names}))
    """
)


def _compile_eight(tmp_path, name: str, cap: int) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / name), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cap)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_the_kernel_cache_is_capped_and_keeps_the_newest(tmp_path):
    whole = _compile_eight(tmp_path, "uncapped", -1)  # JAX's "no limit"
    assert whole["folder"].startswith(str(tmp_path / "uncapped"))
    sizes = sorted(whole["entries"].values())
    assert len(sizes) == 8
    cap = sum(sizes) // 2

    capped = _compile_eight(tmp_path, "capped", cap)
    kept = capped["entries"]
    assert 1 <= len(kept) < 8
    assert sum(kept.values()) <= cap
    # The last program compiled is kept; the first ones went first.
    newest = set(capped["after_each"][-1]) - set(capped["after_each"][-2])
    assert newest and newest <= set(kept)
    assert not set(capped["after_each"][0]) & set(kept)


def test_the_default_folder_keeps_every_kernel_under_the_default_cap(tmp_path):
    from marin_dagster.dupekit import minhash

    got = _compile_eight(tmp_path, "default", minhash.CACHE_MAX_BYTES)
    assert got["folder"] == str(tmp_path / "default" / "marin-dagster" / "jax-lru")
    assert len(got["entries"]) == 8  # far under 1 GiB: nothing evicted
