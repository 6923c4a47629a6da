"""Where dupekit's array work runs: the host or JAX's device, one choice per process.

- host: numpy, and JAX kernels laid out for CPU caches: the fastest path on CPUs.
- device: programs laid out for a GPU or TPU (one fused pass per row, few
  shapes), where the host path's numpy would cap the accelerator.

Both paths give the same results bit for bit (tests hold them equal), so the
choice is an execution detail, not part of a step's version. `auto` (the
default) takes the device path when JAX's default backend is not the CPU;
`DUPEKIT_COMPUTE=host|device` overrides it (benchmarks, tests).
"""

from __future__ import annotations

import os

import jax

COMPUTE_ENV = "DUPEKIT_COMPUTE"
PATHS = ("auto", "host", "device")


def compute_path() -> str:
    """ "host" or "device": `DUPEKIT_COMPUTE`, or by JAX's default backend."""
    choice = os.environ.get(COMPUTE_ENV, "auto").strip().lower() or "auto"
    if choice not in PATHS:
        raise ValueError(
            f"{COMPUTE_ENV}={os.environ[COMPUTE_ENV]!r}: expected one of {', '.join(PATHS)}"
        )
    if choice == "auto":
        return "host" if jax.default_backend() == "cpu" else "device"
    return choice
