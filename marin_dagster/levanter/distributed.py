"""Multi-host training: one process per host, joined by `jax.distributed`.

A launcher (Iris's local launcher, or an indexed Kubernetes Job) starts one process per host
and tells each where it stands through three environment variables:

    MARIN_COORDINATOR_ADDRESS   host:port of process 0 (which serves jax's coordination service)
    MARIN_NUM_PROCESSES         how many processes take part
    MARIN_PROCESS_ID            this process's index, 0..N-1 (an indexed Job's completion index)

`MARIN_NUM_PROCESSES=auto` leaves the three to jax's own detection (GKE's multi-host TPU
slices set TPU_WORKER_HOSTNAMES and TPU_WORKER_ID). Without them, training is one process, as
before. `initialize_from_env()` must run before anything touches a device; the trainer calls it
first. On CPU, cross-process collectives go through gloo.

Process 0 is the leader: it runs the Dagster step (or the script) and decides what is trained;
it publishes the job (config, output path, settings) in the coordination service's key-value
store, and every other process runs `python -m marin_dagster.levanter.follower`, which reads
the job there and trains it with the leader. All processes compute; only the leader writes the
run's files (config, metrics, params, result); orbax checkpoints are written by all of them.

No Dagster here: the launchers live in `marin_dagster.iris`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import jax

logger = logging.getLogger(__name__)

COORDINATOR_ENV = "MARIN_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "MARIN_NUM_PROCESSES"
PROCESS_ID_ENV = "MARIN_PROCESS_ID"
# Seconds a process waits for the others to join, and a follower for the leader's job: the
# leader joins only when its step starts training (after its inputs are checked, or another
# run's lease on the output is released), and all of a Job's pods must be scheduled. A leader
# that never trains (its step is skipped) ends the gang, which stops the waiting followers.
INIT_TIMEOUT_ENV = "MARIN_DISTRIBUTED_TIMEOUT_S"
DEFAULT_INIT_TIMEOUT_S = 3600.0
AUTO = "auto"

_JOB_KEY = "marin/levanter/train_job"
_initialized: Topology | None = None


@dataclass(frozen=True)
class Topology:
    """Where this process stands among the processes of one training."""

    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0

    @property
    def multi_process(self) -> bool:
        return self.num_processes > 1


def topology_from_env(env: dict[str, str] | None = None) -> Topology | None:
    """The launcher's topology from the environment; None when it names none (one process),
    `Topology(num_processes=0)` for `auto` (jax detects it)."""
    env = dict(os.environ if env is None else env)
    raw = env.get(NUM_PROCESSES_ENV, "").strip()
    if not raw:
        return None
    if raw == AUTO:
        return Topology(num_processes=0)
    try:
        n = int(raw)
        pid = int(env.get(PROCESS_ID_ENV, "0"))
    except ValueError:
        raise ValueError(
            f"{NUM_PROCESSES_ENV}={raw!r} / {PROCESS_ID_ENV}={env.get(PROCESS_ID_ENV)!r}: "
            f"expected integers (or {NUM_PROCESSES_ENV}=auto on a TPU slice)"
        ) from None
    if n < 1 or not 0 <= pid < n:
        raise ValueError(
            f"{NUM_PROCESSES_ENV}={n}, {PROCESS_ID_ENV}={pid}: the process id must be in 0..{n - 1}"
        )
    address = env.get(COORDINATOR_ENV) or None
    if n > 1 and not address:
        raise ValueError(
            f"{NUM_PROCESSES_ENV}={n} but {COORDINATOR_ENV} is unset: the launcher must give "
            "every process the host:port of process 0"
        )
    return Topology(n, pid, address)


def _check_coordinator_port(address: str) -> None:
    """Process 0 serves the coordinator at `address`: a port another program holds would
    crash it in C++ (a segfault) while the other processes wait for it."""
    port = address.rpartition(":")[2]
    if not port.isdigit():
        return  # not host:port: jax says what is wrong with it
    with socket.socket(socket.AF_INET) as probe:
        # as gRPC binds: a port a closed connection left in TIME_WAIT is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", int(port)))
        except OSError as e:
            raise RuntimeError(
                f"the coordinator address {address} (MARIN_COORDINATOR_ADDRESS) cannot be served "
                f"here: port {port} is taken ({e.strerror}); choose a free port for every "
                "process of this training"
            ) from None


def initialize_from_env() -> Topology:
    """Join the other processes of this training (once per process); the topology joined."""
    global _initialized
    if _initialized is not None:
        return _initialized
    from jax._src import distributed as jax_distributed

    if jax_distributed.global_state.client is not None:  # joined by the caller
        _initialized = Topology(jax.process_count(), jax.process_index())
        return _initialized
    topo = topology_from_env()
    if topo is None or topo.num_processes == 1:
        _initialized = Topology()
        return _initialized
    timeout = int(_timeout_s())
    # CPU devices of different processes talk through gloo (GPUs and TPUs have their own).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service would catch SIGTERM and keep training; a preempted host must
    # die by it instead, so the launcher stops the others and retries the step, which
    # resumes from its last checkpoint.
    jax.config.update("jax_enable_preemption_service", False)
    if topo.num_processes == 0:
        jax.distributed.initialize(initialization_timeout=timeout)
    else:
        if topo.process_id == 0:
            _check_coordinator_port(topo.coordinator_address)
        logger.info(
            "process %d of %d joins the training at %s; it waits up to %d s for the others (%s)",
            topo.process_id,
            topo.num_processes,
            topo.coordinator_address,
            timeout,
            INIT_TIMEOUT_ENV,
        )
        jax.distributed.initialize(
            coordinator_address=topo.coordinator_address,
            num_processes=topo.num_processes,
            process_id=topo.process_id,
            initialization_timeout=timeout,
        )
    _initialized = Topology(jax.process_count(), jax.process_index(), topo.coordinator_address)
    logger.info(
        "process %d of %d joined the training (coordinator %s); %d local of %d devices",
        _initialized.process_id,
        _initialized.num_processes,
        topo.coordinator_address or "auto-detected",
        jax.local_device_count(),
        jax.device_count(),
    )
    return _initialized


# The exit code of a process that left because a collective failed (another process died):
# its launcher blames whichever process ended first (see iris.processes.ProcessGang).
PEER_LOST_EXIT_CODE = 75


def leave_if_peer_lost(error: BaseException) -> None:
    """After a failed collective or coordination call in a multi-process training, leave at
    once with `PEER_LOST_EXIT_CODE`, reporting nothing: the cause is most likely another
    process's death (a preempted host), which the launcher sees and retries; a caller that
    reported this error (a Dagster step) would record an ordinary failure instead."""
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return
    import sys
    import traceback

    sys.stderr.write(
        f"marin levanter: process {jax.process_index()} of {jax.process_count()} leaves: a "
        f"collective failed, most likely because another process died:\n"
        + "".join(traceback.format_exception(error))
    )
    sys.stderr.flush()
    os._exit(PEER_LOST_EXIT_CODE)


def _timeout_s() -> float:
    return float(os.environ.get(INIT_TIMEOUT_ENV) or DEFAULT_INIT_TIMEOUT_S)


def is_leader() -> bool:
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process gets here (nothing to wait for in a single process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def allgather(tree: Any) -> Any:
    """Every leaf whole on this host as numpy (a collective: all processes call it)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def _client() -> Any:
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized: call initialize_from_env() first")
    return client


def publish_job(job: dict[str, Any]) -> None:
    """The leader tells the other processes what to train."""
    _client().key_value_set(_JOB_KEY, json.dumps(job))


def fetch_job(timeout_s: float) -> dict[str, Any]:
    """What the leader published (waits for it)."""
    return json.loads(_client().blocking_key_value_get(_JOB_KEY, int(timeout_s * 1000)))


def follow() -> Any:
    """A non-leader process: join, read the leader's job, train it with the leader."""
    from marin_dagster.levanter.config import TrainerSettings, TrainLmConfig
    from marin_dagster.levanter.trainer import train

    topo = initialize_from_env()
    if topo.is_leader:
        raise RuntimeError(
            f"{PROCESS_ID_ENV}=0 is the leader: it runs the training step itself, not "
            "`python -m marin_dagster.levanter.follower`"
        )
    # The leader may still be loading (a Dagster step reads its inputs before training).
    job = fetch_job(_timeout_s())
    return train(
        TrainLmConfig.from_dict(job["config"]),
        job["output_path"],
        settings=TrainerSettings(**job["settings"]),
    )
