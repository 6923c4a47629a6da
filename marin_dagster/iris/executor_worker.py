"""Entry point of an Iris step process: `dagster api execute_step`, except for SIGTERM.

Dagster maps SIGTERM onto its interrupt handling, so a preempted step would record an ordinary
STEP_FAILURE and never be retried. Here SIGTERM keeps its default action: the process dies by
the signal without reporting, and the Iris step handler, which sees exit -15 (or a pod's 143),
retries it as a preemption. Run termination uses SIGINT, which Dagster still records.

A step worker started by the local launcher also dies, with its whole process group, when the
run's process that started it is gone (see `processes.die_with_run_process`).

A multi-host step runs this worker once per host (`MARIN_PROCESS_ID` 0..N-1, from the local
launcher or an indexed Job's completion index): process 0 executes the Dagster step; the others
run the follower module (`MARIN_IRIS_FOLLOWER_MODULE`, default
`marin_dagster.levanter.follower`), which joins process 0's training and reports nothing to
Dagster.

    python -m marin_dagster.iris.executor_worker   # args in DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from dagster._utils import interrupts

from marin_dagster.iris.processes import PROCESS_ID_ENV, RUN_PID_ENV, die_with_run_process

FOLLOWER_MODULE_ENV = "MARIN_IRIS_FOLLOWER_MODULE"
DEFAULT_FOLLOWER_MODULE = "marin_dagster.levanter.follower"


def _keep_sigterm_default() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> None:
    # Popped, so that the step's own children do not inherit a parent that is not theirs.
    run_pid = os.environ.pop(RUN_PID_ENV, None)
    if run_pid:
        die_with_run_process(int(run_pid))
    if int(os.environ.get(PROCESS_ID_ENV) or 0) > 0:
        _keep_sigterm_default()
        runpy.run_module(
            os.environ.get(FOLLOWER_MODULE_ENV) or DEFAULT_FOLLOWER_MODULE,
            run_name="__main__",
            alter_sys=True,
        )
        return
    # Dagster re-installs its handlers whenever it enters an interrupt scope; patch the hook.
    interrupts.setup_interrupt_handlers = _keep_sigterm_default
    _keep_sigterm_default()
    from dagster._cli.api import execute_step_command

    execute_step_command.main(
        args=argv if argv is not None else sys.argv[1:], prog_name="dagster api execute_step"
    )


if __name__ == "__main__":
    main()
