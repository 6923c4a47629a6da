"""A training process for the subprocess tests: `python -m tests.levanter.train_job SPEC_JSON`.

SPEC: {"runs": [{"output": path, "num_devices": n|null, "parallelism": ...}], "datasets": {...},
"sleep_per_step": seconds (slows the run so a test can kill it mid-way), "log_every": n}.
Prints one JSON line per run: the TrainResult and the per-step losses.
"""

from __future__ import annotations

import json
import sys
import time

import jax

from marin_dagster.levanter import AdamConfig, LlamaConfig, TrainerSettings, TrainLmConfig, train

MODEL = LlamaConfig(
    seq_len=32, hidden_dim=32, intermediate_dim=64, num_heads=4, num_kv_heads=2, num_layers=2
)


def main(spec: dict) -> None:
    sleep = spec.get("sleep_per_step", 0.0)
    for run in spec["runs"]:
        config = TrainLmConfig(
            model=MODEL,
            optimizer=AdamConfig(learning_rate=3e-3, warmup=2),
            datasets=spec["datasets"],
            batch_size=8,
            seq_len=16,
            num_train_steps=spec["steps"],
            tokenizer_vocab_size=spec["vocab"],
            steps_per_eval=None,
            max_eval_batches=2,
            checkpoint_every_steps=spec.get("checkpoint_every_steps", 4),
            keep=2,
        )
        settings = TrainerSettings(
            num_devices=run.get("num_devices"),
            parallelism=run.get("parallelism", "data_parallel"),
            log_every=spec.get("log_every", 1),
            checkpoint_every_minutes=None,
            sample_tokens=spec.get("sample_tokens", 8),
        )
        result = train(
            config,
            run["output"],
            settings=settings,
            on_metrics=(lambda _row: time.sleep(sleep)) if sleep else None,
        )
        losses = [json.loads(line) for line in open(result.metrics_path)]
        print(
            json.dumps(
                {
                    "result": result.to_dict(),
                    "devices": jax.device_count(),
                    "losses": [r["loss"] for r in losses if "loss" in r],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
