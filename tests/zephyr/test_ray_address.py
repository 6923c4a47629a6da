"""The Ray backend joins the cluster that RAY_ADDRESS names, as Ray's own tools do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from marin_dagster.zephyr.backends.ray_backend import _check_reachable

# Runs in a process of its own: Ray allows one cluster per process, and the session's
# ray_cluster fixture holds this one's.
_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    child = '''
    import ray
    from marin_dagster.zephyr import Dataset, ZephyrContext

    with ZephyrContext(max_workers=1, backend="ray") as ctx:
        out = ctx.execute(Dataset.from_list([1, 2, 3]).map(lambda x: x * 2))
    print("results", sorted(out.results))
    print("joined", ray.get_runtime_context().gcs_address)
    '''
    try:
        done = subprocess.run(
            [sys.executable, "-c", child],
            env=dict(os.environ, RAY_ADDRESS=address),
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        ray.shutdown()
    print("cluster", address)
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    sys.exit(done.returncode)
    """
)


def test_ray_backend_joins_the_cluster_ray_address_names() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["results"] == "[2, 4, 6]"
    assert lines["joined"] == lines["cluster"]


def test_an_address_where_no_cluster_listens_fails_in_seconds_naming_it() -> None:
    """A typo in RAY_ADDRESS, or a stopped cluster: ray.init() retried in silence for
    minutes, and the step sat with no message."""
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = (
        "from marin_dagster.zephyr import Dataset, ZephyrContext\n"
        "with ZephyrContext(max_workers=1, backend='ray') as ctx:\n"
        "    ctx.execute(Dataset.from_list([1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        env=dict(os.environ, RAY_ADDRESS=f"127.0.0.1:{port}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert f"no Ray cluster answers at 127.0.0.1:{port} (from RAY_ADDRESS)" in done.stderr


def test_an_ipv6_address_in_brackets_is_probed_as_itself() -> None:
    """`[::1]:6379` was probed as the host name "[::1]", which never resolves: a cluster
    listening there was reported as absent."""
    with socket.socket(socket.AF_INET6) as listening:
        listening.bind(("::1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        _check_reachable(f"[::1]:{port}", "address")
        _check_reachable(f"ray://[::1]:{port}", "address")
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at \[::1\]:{port}"):
        _check_reachable(f"[::1]:{port}", "address")
