"""`iris_executor`: Dagster's step-delegating executor with an Iris step handler.

Each step's `marin/resources` op tag (a ResourceConfig) decides where it runs:

- CPU-only steps run as local subprocesses, at most `max_concurrent` at a time (like the
  multiprocess executor);
- accelerator steps go to the configured launcher: `local` (a subprocess given leased devices
  from the machine's inventory, CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS) or `kubernetes`
  (a dagster-k8s Job with GPU/TPU limits, node selectors and tolerations).

A step that dies by preemption (SIGTERM, eviction, node lost) is retried up to
`max_retries_preemption` times; a step process that dies without reporting for any other
reason is retried up to `max_retries_failure` times; a step that reports its own failure
follows the asset's Dagster `retry_policy` (none by default). Terminating the run stops the
step process groups and deletes the run's Jobs.

The run's process is recorded on the run (tags `marin/run_pid`, `marin/run_host`), and local
step workers die with their process group when it is gone, so `kill -9` of the run leaves no
step running. Each run's executor, at start, marks the runs on this host whose process is
gone as FAILURE (`marin_dagster.execution.instance.fail_orphaned_runs`).

The handler keeps its state (queue, leases, processes) between the executor's calls to
launch/check/terminate; the executor calls `check_step_health` every
`check_step_health_interval_seconds`, which is also when queued steps start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import typing
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import (
    Field,
    Map,
    Noneable,
    Permissive,
    Shape,
    executor,
)
from dagster import _check as check
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
from dagster._core.definitions.metadata import MetadataValue
from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
from dagster._core.execution.plan.objects import StepRetryData
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.execution.tags import get_tag_concurrency_limits_config
from dagster._core.executor.base import Executor
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating import (
    CheckStepHealthResult,
    StepDelegatingExecutor,
    StepHandler,
    StepHandlerContext,
)
from dagster._utils.error import SerializableErrorInfo

from marin_dagster.execution.instance import fail_orphaned_runs, run_process_tags
from marin_dagster.iris import placement
from marin_dagster.iris.inventory import DeviceLeases, LocalInventory, default_lease_dir
from marin_dagster.iris.processes import (
    RUN_PID_ENV,
    ProcessGang,
    free_port,
    gang_env,
    was_preempted,
)
from marin_dagster.iris.resource_config import ResourceConfig, ResourceConfigError, parse_bytes
from marin_dagster.iris.settings import IrisSettings
from marin_dagster.settings import field_default, settings_fields, unwrap_optional

if TYPE_CHECKING:
    from marin_dagster.iris.executor_k8s import KubernetesLauncher

logger = logging.getLogger(__name__)

WORKER_MODULE = "marin_dagster.iris.executor_worker"
_TERMINAL_EVENTS = {
    DagsterEventType.STEP_SUCCESS,
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.STEP_UP_FOR_RETRY,
}


def _dagster_type(tp: Any) -> Any:
    inner, optional = unwrap_optional(tp)
    if dataclasses.is_dataclass(inner):
        converted: Any = Shape({f.name: _dagster_field(f, t) for f, t in settings_fields(inner)})
    elif typing.get_origin(inner) is tuple:
        converted = [_dagster_type(typing.get_args(inner)[0])]
    elif typing.get_origin(inner) in (Mapping, dict):
        key, value = typing.get_args(inner)
        converted = Permissive() if value is Any else Map(key, value)
    else:
        converted = inner
    return Noneable(converted) if optional else converted


def _dagster_field(f: dataclasses.Field, tp: Any) -> Field:
    description = f.metadata.get("description") or None
    inner, _ = unwrap_optional(tp)
    if dataclasses.is_dataclass(inner):  # defaults come from the nested fields
        return Field(_dagster_type(tp), is_required=False, description=description)
    return Field(
        _dagster_type(tp),
        is_required=False,
        default_value=_plain_default(f),
        description=description,
    )


def _plain_default(f: dataclasses.Field) -> Any:
    value = field_default(f)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


# The executor's config: every IrisSettings field (derived, so it cannot drift from
# IrisResource), plus Dagster's own executor settings.
IRIS_EXECUTOR_CONFIG_SCHEMA: dict[str, Field] = {
    **{f.name: _dagster_field(f, tp) for f, tp in settings_fields(IrisSettings)},
    "retries": get_retries_config(),
    "tag_concurrency_limits": get_tag_concurrency_limits_config(),
}


def settings_from_executor_config(config: Mapping[str, Any]) -> IrisSettings:
    return IrisSettings.from_dict({k: v for k, v in config.items() if k in _SETTING_NAMES})


_SETTING_NAMES = {f.name for f in dataclasses.fields(IrisSettings)}


@dataclass
class _Step:
    key: str
    context: StepHandlerContext
    request: ResourceConfig
    attempt: int
    route: str  # "local" | "kubernetes"
    reported_at_launch: int
    status: str = "queued"  # queued, running, exited, retry_requested, failed, terminated
    # The step's processes: one, or one per host of a multi-host step (process 0 reports).
    proc: ProcessGang | None = None
    returncode: int | None = None
    devices: tuple = ()
    job_name: str | None = None
    namespace: str | None = None
    waiting_logged: bool = False
    node_logged: bool = False


class IrisStepHandler(StepHandler):
    """Routes each step to a local subprocess or the configured launcher (see module doc)."""

    def __init__(
        self,
        settings: IrisSettings,
        retries: RetryMode,
        k8s_apis: tuple[Any, Any] | None = None,
    ) -> None:
        super().__init__()
        self._settings = settings
        self._retries = retries
        self._k8s_apis = k8s_apis
        self._k8s: KubernetesLauncher | None = None
        self._inventory: LocalInventory | None = None
        self._leases: DeviceLeases | None = None
        self._steps: dict[str, _Step] = {}
        self._queue: list[str] = []
        self._preemptions: Counter[str] = Counter()
        self._crash_retries: Counter[str] = Counter()
        self._validated = False
        self._short_warned: set[str] = set()
        # The executor calls from one thread; the lock guards against a caller that doesn't.
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return "IrisStepHandler"

    # -- helpers ---------------------------------------------------------------------------

    @property
    def inventory(self) -> LocalInventory:
        if self._inventory is None:
            self._inventory = self._settings.inventory.local_inventory()
            self._leases = DeviceLeases(
                self._inventory, self._settings.lease_dir or default_lease_dir()
            )
        return self._inventory

    @property
    def leases(self) -> DeviceLeases:
        self.inventory  # noqa: B018 -- creates the leases with the inventory
        assert self._leases is not None
        return self._leases

    @property
    def k8s(self) -> KubernetesLauncher:
        if self._k8s is None:
            batch, core = self._k8s_apis or (None, None)
            # The Kubernetes client and dagster-k8s load only where a step goes there.
            from marin_dagster.iris.executor_k8s import KubernetesLauncher

            self._k8s = KubernetesLauncher(
                self._settings.kubernetes, batch_api=batch, core_api=core
            )
        return self._k8s

    @staticmethod
    def _step_key(ctx: StepHandlerContext) -> str:
        keys = check.not_none(ctx.execute_step_args.step_keys_to_execute)
        check.invariant(len(keys) == 1, "Iris launches one step at a time")
        return keys[0]

    def _route(self, request: ResourceConfig) -> str:
        if request.needs_accelerator and self._settings.launcher == "kubernetes":
            return "kubernetes"
        return "local"

    def _validate_plan(self, ctx: StepHandlerContext) -> None:
        """Every step's request must be readable and satisfiable before anything launches."""
        plan_context = getattr(ctx, "_plan_context", None)
        steps = plan_context.execution_plan.steps if plan_context is not None else []
        problems = []
        local: list[tuple[str, ResourceConfig]] = []
        for step in steps:
            try:
                request = ResourceConfig.from_op_tags(step.tags)
            except ResourceConfigError as e:
                problems.append(f"step {step.key!r}: {e}" if step.key not in str(e) else str(e))
                continue
            if self._route(request) == "local" and request.needs_accelerator:
                local.append((step.key, request))
        if local:
            try:
                inventory = self.inventory
            except ResourceConfigError as e:  # the executor's config: said once, not per step
                problems.append(
                    f"the executor's device {e} (steps {', '.join(k for k, _ in local)})"
                )
            else:
                for key, request in local:
                    try:
                        inventory.check_feasible(request, key)
                    except ResourceConfigError as e:
                        problems.append(str(e))
        if problems:
            raise ResourceConfigError(
                "Iris cannot place this run; nothing was launched:\n  " + "\n  ".join(problems)
            )
        if self._settings.launcher == "kubernetes" and any(
            ResourceConfig.from_op_tags(s.tags).needs_accelerator for s in steps
        ):
            self._check_shared_instance(ctx)

    def _check_shared_instance(self, ctx: StepHandlerContext) -> None:
        if not self._settings.kubernetes.require_shared_instance:
            return
        storage = type(ctx.instance.run_storage).__name__
        if "Sqlite" in storage or "InMemory" in storage:
            raise ResourceConfigError(
                f"the Kubernetes launcher needs an instance that step pods can reach (Postgres, "
                f"as Dagster's Helm chart sets up); this run's instance uses {storage}. Point "
                f"DAGSTER_HOME at a dagster.yaml with Postgres storage (docs/operations.md), or set "
                f"kubernetes.require_shared_instance=false if you know the pods share it."
            )

    def _reported(self, st: _Step) -> int:
        records = st.context.instance.get_records_for_run(
            st.context.execute_step_args.run_id, of_type=_TERMINAL_EVENTS
        ).records
        return sum(1 for r in records if r.event_log_entry.step_key == st.key)

    def _event(
        self, st: _Step, message: str, metadata: Mapping[str, Any] | None = None
    ) -> DagsterEvent:
        return DagsterEvent.engine_event(
            st.context.get_step_context(st.key),
            message,
            EngineEventData(
                metadata={k: MetadataValue.text(str(v)) for k, v in (metadata or {}).items()}
            ),
        )

    # -- scheduling ---------------------------------------------------------------------------

    def _poll(self) -> None:
        for st in self._steps.values():
            if st.status == "running" and st.proc is not None:
                rc = st.proc.poll()  # an ended gang has killed its remaining processes
                if rc is not None:
                    st.status, st.returncode = "exited", rc
                    if st.devices:
                        self.leases.release(st.key)

    def _running_cpu(self) -> int:
        return sum(
            1
            for st in self._steps.values()
            if st.status == "running" and st.route == "local" and not st.request.needs_accelerator
        )

    def _schedule(self) -> list[DagsterEvent]:
        events = []
        for key in list(self._queue):
            st = self._steps[key]
            event = self._try_start(st)
            if event is not None:
                self._queue.remove(key)
                events.append(event)
        return events

    def _try_start(self, st: _Step) -> DagsterEvent | None:
        if st.route == "kubernetes":
            return self._start_k8s(st)
        devices: tuple = ()
        if st.request.needs_accelerator:
            got = self.leases.acquire(st.key, st.request)
            if got is None:
                if not st.waiting_logged:
                    st.waiting_logged = True
                    self._event(
                        st,
                        f'Step "{st.key}" waits for '
                        f"{st.request.accelerator_count * st.request.replicas} "
                        f"{st.request.device.kind.upper()}(s): its devices are busy",
                        {"requested": st.request, "devices": self.leases.holders(st.request)},
                    )
                return None
            devices = got
        elif self._running_cpu() >= self._settings.cpu_slots:
            return None
        return self._start_local(st, devices)

    def _start_local(self, st: _Step, devices: tuple) -> DagsterEvent:
        args = st.context.execute_step_args
        host = socket.gethostname()
        assigned = ",".join(str(d) for d in devices)
        base = dict(os.environ)
        base.update({e["name"]: e["value"] for e in args.get_command_env()})
        base.update(
            {
                placement.REQUESTED_ENV: st.request.to_string(),
                placement.HOST_ENV: host,
                placement.LAUNCHER_ENV: "local",
                placement.ATTEMPT_ENV: str(st.attempt),
                "DAGSTER_RUN_STEP_KEY": st.key,
                RUN_PID_ENV: str(os.getpid()),
            }
        )
        # A multi-host step (replicas > 1): one process per replica on this machine, each with
        # its share of the devices, joined through process 0's coordinator (the "hosts").
        n = st.request.num_processes
        per = len(devices) // n if n > 1 else len(devices)
        shares = [devices[i * per : (i + 1) * per] for i in range(n)] if n > 1 else [devices]
        coordinator = f"127.0.0.1:{free_port()}" if n > 1 else ""
        envs = []
        for i, share in enumerate(shares):
            env = dict(base)
            env.update(placement.device_env(share))
            env[placement.ASSIGNED_DEVICES_ENV] = ",".join(str(d) for d in share)
            if n > 1:
                env.update(gang_env(n, i, coordinator))
            envs.append(env)
        self._warn_if_machine_short(st, host)
        executable = args.job_origin.executable_path or sys.executable
        try:
            st.proc = ProcessGang.start([[executable, "-m", WORKER_MODULE]] * n, envs)
        except OSError:
            if devices:
                self.leases.release(st.key)
            raise
        st.status, st.devices = "running", devices
        visible = {k: envs[0][k] for k in placement.device_env(shares[0])}
        processes = (
            f" as {n} processes (pids {', '.join(map(str, st.proc.pids))}; coordinator "
            f"{coordinator})"
            if n > 1
            else f" (pid {st.proc.pid})"
        )
        return DagsterEvent.step_worker_starting(
            st.context.get_step_context(st.key),
            message=(
                f'Iris runs step "{st.key}" locally on {host}{processes}: asked for '
                f"{st.request}, given {assigned or 'no accelerator'}."
            ),
            metadata={
                "iris/requested": MetadataValue.text(st.request.to_string()),
                "iris/assigned": MetadataValue.text(assigned or "none"),
                "iris/host": MetadataValue.text(host),
                "iris/launcher": MetadataValue.text("local"),
                "iris/attempt": MetadataValue.text(str(st.attempt)),
                "pid": MetadataValue.text(str(st.proc.pid)),
                "env": MetadataValue.json(visible),
                **(
                    {
                        "iris/processes": MetadataValue.text(str(n)),
                        "pids": MetadataValue.text(",".join(map(str, st.proc.pids))),
                        "coordinator": MetadataValue.text(coordinator),
                    }
                    if n > 1
                    else {}
                ),
            },
        )

    def _warn_if_machine_short(self, st: _Step, host: str) -> None:
        # Only here, not when the asset is defined: the same experiment may run on a k8s node
        # that has them. Locally nothing pins cores or caps memory, so the step runs on what
        # there is (and may be killed for memory by the kernel, which names no step).
        if st.key in self._short_warned:
            return
        cores, memory = available_cores(), available_memory()
        short = []
        if st.request.cpu > cores:
            short.append(f"{cores} CPU cores")
        if memory is not None and parse_bytes(st.request.ram, "ram") > memory:
            short.append(f"{memory / 2**30:.1f} GiB of memory")
        if not short:
            return
        self._short_warned.add(st.key)
        st.context.get_step_context(st.key).log.warning(
            f'Step "{st.key}" asks for {st.request}, and this machine ({host}) has '
            f"{' and '.join(short)}; it runs with what there is. Lower the request, or run it "
            "with launcher='kubernetes' on a node that has it."
        )

    def _start_k8s(self, st: _Step) -> DagsterEvent:
        ctx = st.context
        args = ctx.execute_step_args
        image = self._settings.kubernetes.image or args.job_origin.repository_origin.container_image
        executable = args.job_origin.executable_path or "python"
        job, namespace = self.k8s.render_job(
            run=ctx.dagster_run,
            run_launcher=ctx.instance.run_launcher,
            step_key=st.key,
            attempt=st.attempt,
            step_tags=ctx.step_tags[st.key],
            command=[executable, "-m", WORKER_MODULE],
            command_env=args.get_command_env(),
            image=image,
        )
        self.k8s.create(job, namespace)
        st.status, st.job_name, st.namespace = "running", job.metadata.name, namespace
        container = job.spec.template.spec.containers[0]
        return DagsterEvent.step_worker_starting(
            ctx.get_step_context(st.key),
            message=(
                f'Iris runs step "{st.key}" as Kubernetes Job {namespace}/{job.metadata.name}: '
                f"asked for {st.request}."
            ),
            metadata={
                "iris/requested": MetadataValue.text(st.request.to_string()),
                "iris/launcher": MetadataValue.text("kubernetes"),
                "iris/attempt": MetadataValue.text(str(st.attempt)),
                "Kubernetes Job name": MetadataValue.text(job.metadata.name),
                "namespace": MetadataValue.text(namespace),
                "limits": MetadataValue.json(dict(container.resources.limits or {})),
                "node_selector": MetadataValue.json(
                    dict(job.spec.template.spec.node_selector or {})
                ),
            },
        )

    # -- StepHandler -----------------------------------------------------------------------------

    def launch_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        with self._lock:
            if not self._validated:
                self._validate_plan(step_handler_context)
                self._validated = True
            key = self._step_key(step_handler_context)
            request = ResourceConfig.from_op_tags(step_handler_context.step_tags[key])
            known = step_handler_context.execute_step_args.known_state
            attempt = known.get_retry_state().get_attempt_count(key) if known else 0
            st = _Step(
                key=key,
                context=step_handler_context,
                request=request,
                attempt=attempt,
                route=self._route(request),
                reported_at_launch=0,
            )
            st.reported_at_launch = self._reported(st)
            self._steps[key] = st
            self._queue.append(key)
            self._poll()
            events = self._schedule()
        yield from events

    def check_step_health(self, step_handler_context: StepHandlerContext) -> CheckStepHealthResult:
        with self._lock:
            self._poll()
            self._schedule()
            key = self._step_key(step_handler_context)
            st = self._steps.get(key)
            if st is None:
                return CheckStepHealthResult.unhealthy(
                    f"step {key} is not known to this Iris executor (was the run worker restarted?)"
                )
            if st.status in ("queued", "retry_requested", "failed", "terminated"):
                return CheckStepHealthResult.healthy()
            if st.route == "local":
                if st.status == "running" or st.returncode == 0:
                    return CheckStepHealthResult.healthy()
                rc = st.returncode
                gang = check.not_none(st.proc)
                who = (
                    f"process {gang.failed_process} of {len(gang.procs)} of the step "
                    f"(pid {gang.procs[gang.failed_process].pid}) exited with code {rc}, and "
                    "Iris stopped the others"
                    if gang.failed_process
                    else f"step process exited with code {rc}"
                )
                return self._after_death(
                    st,
                    was_preempted(rc),
                    who + (" (SIGTERM: preempted)" if was_preempted(rc) else ""),
                )
            state = self.k8s.state(
                check.not_none(st.job_name),
                check.not_none(st.namespace),
                st.request.num_processes,
            )
            if state.phase == "running":
                self._log_node(st)
                return CheckStepHealthResult.healthy()
            if state.phase == "succeeded":
                return CheckStepHealthResult.healthy()
            return self._after_death(st, state.phase == "preempted", state.reason)

    def _log_node(self, st: _Step) -> None:
        if st.node_logged:
            return
        pods = self.k8s.client.core_api.list_namespaced_pod(
            namespace=st.namespace, label_selector=f"job-name={st.job_name}"
        ).items
        nodes = sorted({p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name})
        if nodes:
            st.node_logged = True
            self._event(
                st,
                f'Step "{st.key}" runs on node {", ".join(nodes)}',
                {"iris/host": ", ".join(nodes), "Kubernetes Job name": st.job_name},
            )

    def _after_death(self, st: _Step, preempted: bool, reason: str) -> CheckStepHealthResult:
        """The step's process/pod is gone without success: retry it or report it failed."""
        if self._reported(st) > st.reported_at_launch:
            # The step recorded its own outcome (success, failure, retry request) before exiting.
            return CheckStepHealthResult.healthy()
        retries_on = not self._retries.disabled
        if preempted:
            counter, limit, kind = (
                self._preemptions,
                self._settings.max_retries_preemption,
                "preemption",
            )
        else:
            counter, limit, kind = (
                self._crash_retries,
                self._settings.max_retries_failure,
                "failure",
            )
        if retries_on and counter[st.key] < limit:
            counter[st.key] += 1
            st.status = "retry_requested"
            DagsterEvent.step_retry_event(
                st.context.get_step_context(st.key),
                StepRetryData(
                    error=SerializableErrorInfo(
                        message=f"{reason}; Iris retries it ({kind} retry {counter[st.key]} of {limit})",
                        stack=[],
                        cls_name="Preempted" if preempted else "StepProcessDied",
                    ),
                    seconds_to_wait=None,
                ),
            )
            return CheckStepHealthResult.healthy()
        st.status = "failed"
        detail = (
            f" after {counter[st.key]} {kind} retries (max_retries_{kind}={limit})"
            if retries_on
            else " (retries are disabled)"
        )
        return CheckStepHealthResult.unhealthy(reason + detail)

    def close(self, exit_wait_seconds: float = 30.0) -> None:
        """End of the run's plan: let finished steps' processes exit, then free every lease.

        A step reports success a moment before its process exits; its devices stay leased
        until then (its memory is still in use). Processes still alive after the wait are
        stopped, so a long-lived run worker (an in-process script) keeps no lease or child.
        """
        with self._lock:
            for st in self._steps.values():
                if st.status == "running" and st.proc is not None:
                    try:
                        st.proc.wait(timeout=exit_wait_seconds)
                    except subprocess.TimeoutExpired:
                        logger.warning(
                            "step %s still running at the end of its run; stopping it", st.key
                        )
                        st.proc.stop(self._settings.termination_grace_seconds)
            self._poll()
            if self._leases is not None:
                self._leases.release_all()

    def terminate_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        with self._lock:
            key = self._step_key(step_handler_context)
            st = self._steps.get(key)
            if st is None:
                return
            if key in self._queue:
                self._queue.remove(key)
            previous, st.status = st.status, "terminated"
            if st.route == "local" and st.proc is not None:
                rc = st.proc.stop(self._settings.termination_grace_seconds)
                if st.devices:
                    self.leases.release(st.key)
                message = f'Iris stopped step "{key}" (process group {st.proc.pid}, exit {rc})'
            elif st.route == "kubernetes" and previous != "queued":
                namespace = check.not_none(st.namespace)
                deleted = self.k8s.delete_run_jobs(st.context.execute_step_args.run_id, namespace)
                if st.job_name and st.job_name not in deleted:
                    self.k8s.delete(st.job_name, namespace)
                message = f"Iris deleted the Kubernetes Jobs of this run: {', '.join(deleted) or st.job_name}"
            else:
                message = f'Iris dropped queued step "{key}"'
        yield self._event(st, message)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's cpuset, taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """The bytes this process may use: the machine's memory, or its cgroup's limit (a
    container's) where that is lower; None where neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
        break
    return total


class IrisExecutor(StepDelegatingExecutor):
    """The step-delegating executor, plus cleanup of the handler when the run's plan is done."""

    def __init__(self, step_handler: IrisStepHandler, **kwargs: Any) -> None:
        super().__init__(step_handler, **kwargs)
        self._iris_handler = step_handler

    def _claim_run(self, plan_context: Any) -> Iterator[DagsterEvent]:
        """Record this process as the run's driver, and end the runs whose driver is gone."""
        instance = plan_context.instance
        instance.add_run_tags(plan_context.run_id, run_process_tags())
        try:
            ended = fail_orphaned_runs(instance)
        except Exception as e:  # noqa: BLE001 -- tidying other runs must not fail this one
            plan_context.log.warning(f"Iris could not check for runs whose process is gone: {e!r}")
            return
        if ended:
            yield DagsterEvent.engine_event(
                plan_context,
                f"Marked {len(ended)} run(s) whose process on this host is gone as ended: "
                + ", ".join(ended),
                EngineEventData(metadata={"runs": MetadataValue.json(ended)}),
            )

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[DagsterEvent]:
        try:
            yield from self._claim_run(plan_context)
            yield from super().execute(plan_context, execution_plan)
        finally:
            self._iris_handler.close()


@executor(
    name="iris",
    config_schema=IRIS_EXECUTOR_CONFIG_SCHEMA,
    requirements=multiple_process_executor_requirements(),
)
def iris_executor(init_context: InitExecutorContext) -> Executor:
    """Runs CPU steps as local subprocesses and accelerator steps on the Iris launcher.

    Configure it in run config (`execution: {config: {...}}`) or bind a configured copy:
    `IrisResource(...).executor()`. Steps say what they need with the `marin/resources` op tag
    (`ResourceConfig.to_op_tags()`).
    """
    config = init_context.executor_config
    settings = settings_from_executor_config(config)
    retries = RetryMode.from_config(config["retries"])
    return IrisExecutor(
        IrisStepHandler(settings, check.not_none(retries)),
        retries=check.not_none(retries),
        sleep_seconds=settings.sleep_seconds,
        check_step_health_interval_seconds=settings.check_step_health_interval_seconds,
        tag_concurrency_limits=config.get("tag_concurrency_limits"),
    )


__all__ = [
    "IRIS_EXECUTOR_CONFIG_SCHEMA",
    "available_cores",
    "IrisExecutor",
    "IrisSettings",
    "IrisStepHandler",
    "iris_executor",
]
