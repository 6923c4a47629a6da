"""Benchmark: the Levanter engine's train loop against a minimal hand-written JAX + optax loop.

Same model code, batch, sequence length and optimizer, measured in the same run
(alternating rounds, best of each, since the machine may be shared). Prints:
  - step time and tokens/s of both, and the ratio engine/baseline (target <= 1.10x);
  - the engine with a checkpoint every `--checkpoint-every` steps against the engine
    with none until the end (async orbax saves should not stall the loop);
  - MFU with its formula.

    .venv/bin/python benchmarks/train.py [--model llama_nano] [--steps 60] [--batch-size 8]
                                         [--seq-len 256] [--vocab 8192] [--dtype float32]
"""

from __future__ import annotations

import os
import sys

# Run as a script, sys.path[0] is benchmarks/, whose sibling scripts (tokenize.py)
# would shadow standard modules: put the repository root there instead.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from marin_dagster.levanter import (  # noqa: E402
    MFU_FORMULA,
    NAMED_CONFIGS,
    AdamConfig,
    LlamaConfig,
    TrainerSettings,
    TrainLmConfig,
    train,
    training_flops_per_token,
)
from marin_dagster.levanter.metrics import peak_flops  # noqa: E402
from marin_dagster.levanter.model import init_params, loss_fn  # noqa: E402
from marin_dagster.tokenize.cache import TokenCacheShardWriter, finalize_split  # noqa: E402


def write_random_cache(path: str, vocab: int, num_tokens: int) -> str:
    rng = np.random.default_rng(0)
    with TokenCacheShardWriter(os.path.join(path, "train", "part-00000"), np.uint16) as w:
        for _ in range(num_tokens // 1000):
            w.add(rng.integers(0, vocab, 1000))
    finalize_split(os.path.join(path, "train"), ["part-00000"], np.uint16, 0)
    return path


def baseline_step_time(model: LlamaConfig, opt: AdamConfig, steps: int, batch: int, seq: int,
                       dtype: str) -> float:
    """A plain jitted step: value_and_grad + the same optax transformation (clipping, AdamW with
    the decay mask), random batches from numpy: no data loader, metrics, checkpoints or mesh."""
    tx = opt.build(steps)
    params = init_params(model, jax.random.PRNGKey(0))
    opt_state = tx.init(params)
    compute = jnp.dtype(dtype)

    @jax.jit
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, model, compute)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    vocab = model.vocab_size
    params, opt_state, loss = step(params, opt_state, rng.integers(0, vocab, (batch, seq), dtype=np.int32))
    loss.block_until_ready()
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, rng.integers(0, vocab, (batch, seq), dtype=np.int32))
    loss.block_until_ready()
    return (time.perf_counter() - start) / steps


def engine_step_time(config: TrainLmConfig, out: str, settings: TrainerSettings) -> float:
    """Per-step wall time of the engine's loop between its first and last log points
    (checkpoint saves included, compile excluded)."""
    stamps: list[tuple[int, float]] = []
    train(config, out, settings=settings,
          on_metrics=lambda row: stamps.append((row["step"], time.perf_counter())) if "loss" in row else None)
    (s0, t0), (s1, t1) = stamps[0], stamps[-1]
    return (t1 - t0) / (s1 - s0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama_nano", choices=sorted(NAMED_CONFIGS))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model = NAMED_CONFIGS[args.model].with_vocab(args.vocab)
    opt = AdamConfig()
    tokens_per_step = args.batch_size * args.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        cache = write_random_cache(os.path.join(tmp, "cache"), args.vocab,
                                   max(4 * tokens_per_step * args.steps, 200_000))
        base = dict(model=model, optimizer=opt, datasets={cache: 1.0}, batch_size=args.batch_size,
                    seq_len=args.seq_len, num_train_steps=args.steps, tokenizer_vocab_size=args.vocab,
                    validation={})
        settings = TrainerSettings(compute_dtype=args.dtype, log_every=10, checkpoint_every_minutes=None,
                                   sample_tokens=0, keep=2)
        times: dict[str, list[float]] = {"baseline": [], "engine": [], "engine+ckpt": []}
        for r in range(args.rounds):
            times["baseline"].append(baseline_step_time(model, opt, args.steps, args.batch_size,
                                                        args.seq_len, args.dtype))
            times["engine"].append(engine_step_time(
                TrainLmConfig(**base, checkpoint_every=10**9), os.path.join(tmp, f"e{r}"), settings))
            times["engine+ckpt"].append(engine_step_time(
                TrainLmConfig(**base, checkpoint_every=args.checkpoint_every), os.path.join(tmp, f"c{r}"),
                settings))

    best = {k: min(v) for k, v in times.items()}
    flops = training_flops_per_token(model, args.seq_len)
    peak = peak_flops(jax.local_devices())
    print(f"model {args.model} ({model.num_parameters() / 1e6:.2f}M params, vocab {args.vocab}), "
          f"batch {args.batch_size} x seq {args.seq_len}, {args.dtype}, {args.steps} steps, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}")
    for name, t in best.items():
        tps = tokens_per_step / t
        print(f"  {name:12s} step {t * 1e3:8.2f} ms  (median {statistics.median(times[name]) * 1e3:8.2f})  "
              f"{tps:10.0f} tokens/s  MFU {tps * flops / peak:.2%}")
    print(f"engine / baseline step time:        {best['engine'] / best['baseline']:.3f}x (target <= 1.10x)")
    print(f"engine with checkpoints every {args.checkpoint_every} / without: "
          f"{best['engine+ckpt'] / best['engine']:.3f}x")
    print(f"MFU formula: {MFU_FORMULA}")
    print(f"  flops/token {flops:.3e}, peak {peak:.3e} FLOP/s "
          f"({'CPU estimate: cores x 2.5 GHz x 32 FLOP/cycle' if jax.devices()[0].platform == 'cpu' else 'vendor peak'})")


if __name__ == "__main__":
    main()
