"""Issue 14's GPU figures in one device run: attention check, MFU, remat, 128k vocabulary, checkpoints.

Stages (each one's figures, or its error, are written to `{out}/gpu_train_check.json` as soon
as it ends, so a run stopped at its time limit still returns what it measured):
  attention  the model's logits with attention through jax.nn.dot_product_attention ("auto":
             cuDNN for bfloat16 on an NVIDIA GPU) against reference_attention, in bfloat16 and
             float32; one attention call's output and gradients likewise; whether the compiled
             train step calls cuDNN's fused attention;
  150m       llama_150m, batch 64 x seq 1024, bfloat16, vocab 32000: hand loop vs engine (remat
             dots, the default), the hand loop under none and block, engine with a checkpoint
             every 10 steps vs none;
  1.2b       the 1.2B config (benchmarks/train.py's llama_1_2b) at 16 x 2048, same comparisons
             without checkpoints;
  vocab128k  llama_150m with a 128256-token vocabulary at 32 x 1024: the hand loop and the engine
             train (finite, falling loss), and the step's memory.

    python3 benchmarks/gpu_train_check.py --out "$OUT"                       # on the H200
    .venv/bin/python benchmarks/gpu_train_check.py --tiny --out /tmp/gpu-check   # CPU rehearsal

`--tiny` runs every stage with toy shapes, to check the script end to end before device time.
"""

from __future__ import annotations

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One process runs every stage: let JAX take most of the GPU (default 75%), so the 1.2B step
# with remat none has room. Set before JAX starts its backend.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.train import BENCH_CONFIGS, report, run_benchmark  # noqa: E402
from marin_dagster.levanter.attention import causal_attention, cudnn_applies, reference_attention  # noqa: E402
from marin_dagster.levanter.model import forward, init_params, loss_fn  # noqa: E402

T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def env_info() -> dict[str, Any]:
    d = jax.devices()[0]
    info: dict[str, Any] = {
        "jax": jax.__version__,
        "platform": d.platform,
        "device_kind": d.device_kind,
        "device_count": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    try:
        from jax._src.lib import cuda_versions  # present in CUDA jaxlib builds

        info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception as e:  # a CPU jaxlib has none
        info["cudnn"] = f"unknown ({type(e).__name__})"
    return info


def attention_check(tiny: bool) -> dict[str, Any]:
    """Max abs differences against reference_attention (the model's attention before issue 14)."""
    name, vocab, batch, seq = ("llama_nano", 256, 2, 64) if tiny else ("llama_150m", 32000, 2, 1024)
    config = BENCH_CONFIGS[name].with_vocab(vocab)
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, vocab, (batch, seq)), jnp.int32)
    out: dict[str, Any] = {"model": name, "batch": batch, "seq": seq}
    fwd = jax.jit(forward, static_argnums=(2, 3), static_argnames=("attention_impl",))
    for dtype in (jnp.bfloat16, jnp.float32):
        new = fwd(params, tokens, config, dtype)
        ref = fwd(params, tokens, config, dtype, attention_impl="reference")
        out[f"logits_max_abs_diff_{jnp.dtype(dtype).name}"] = float(jnp.max(jnp.abs(new - ref)))
        out[f"logits_std_{jnp.dtype(dtype).name}"] = float(jnp.std(ref))
    # One grouped-query call at the 1.2B's head size: output and gradients, bfloat16 inputs.
    rng = np.random.default_rng(1)
    b, t, h, kv, hd = (2, 64, 4, 2, 16) if tiny else (4, 2048, 16, 4, 128)
    q, k, v = (
        jnp.asarray(rng.normal(size=s), jnp.bfloat16)
        for s in ((b, t, h, hd), (b, t, kv, hd), (b, t, kv, hd))
    )
    out["cudnn_applies_bf16"] = cudnn_applies(q)

    def grads(fn: Callable) -> Any:
        return jax.jit(
            jax.value_and_grad(
                lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2)
            )
        )(q, k, v)

    (val, g), (ref_val, ref_g) = grads(causal_attention), grads(reference_attention)
    out["call_output_rel_diff"] = float(abs(val - ref_val) / abs(ref_val))
    out["call_grad_max_abs_diff"] = [
        float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
        for x, y in zip(g, ref_g, strict=True)
    ]
    out["call_grad_max_abs"] = [float(jnp.max(jnp.abs(y.astype(jnp.float32)))) for y in ref_g]
    # Does the bfloat16 train step's program call cuDNN's fused attention?
    text = (
        jax.jit(jax.grad(loss_fn), static_argnums=(2, 3))
        .lower(params, tokens, config, jnp.bfloat16)
        .as_text()
    )
    out["train_step_calls_cudnn_fmha"] = "cudnn$fmha" in text or "__cudnn" in text
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    p.add_argument("--tiny", action="store_true", help="toy shapes: a CPU rehearsal of every stage")
    p.add_argument("--only", nargs="*", help="run only these stages")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_train_check.json")
    results: dict[str, Any] = {}

    def stage(name: str, fn: Callable[[], Any]) -> None:
        if args.only and name not in args.only:
            return
        say(f"stage {name}")
        start = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as e:  # record and go on: later stages still measure
            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {e}"[:3000]}
        results[name + "_seconds"] = round(time.perf_counter() - start, 1)
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=str)
        say(f"stage {name} done: {json.dumps(results[name], default=str)[:1500]}")

    tiny = args.tiny
    stage("env", env_info)
    stage("attention", lambda: attention_check(tiny))

    def bench(name: str, **kw: Any) -> dict[str, Any]:
        result = run_benchmark(name, log=say, **kw)
        report(result, log=say)
        return result

    stage(
        "150m",
        lambda: bench(
            "llama_nano" if tiny else "llama_150m",
            vocab=512 if tiny else 32000,
            batch=4 if tiny else 64,
            seq=64 if tiny else 1024,
            dtype="bfloat16",
            steps=20 if tiny else 60,
            rounds=2,
            remat="dots",
            alt_remat=("none", "block"),
            checkpoint_every_steps=10,
        ),
    )
    stage(
        "1.2b",
        lambda: bench(
            "llama_nano" if tiny else "llama_1_2b",
            vocab=512 if tiny else 32000,
            batch=2 if tiny else 16,
            seq=128 if tiny else 2048,
            dtype="bfloat16",
            steps=20,
            rounds=1,
            remat="dots",
            alt_remat=("none", "block"),
            checkpoint_every_steps=None,
        ),
    )
    stage(
        "vocab128k",
        lambda: bench(
            "llama_nano" if tiny else "llama_150m",
            vocab=128256,
            batch=2 if tiny else 32,
            seq=64 if tiny else 1024,
            dtype="bfloat16",
            steps=20,
            rounds=1,
            remat="dots",
            checkpoint_every_steps=None,
        ),
    )
    say(f"all stages done; figures in {path}")


if __name__ == "__main__":
    main()
