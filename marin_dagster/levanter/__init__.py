"""Levanter-style training in JAX: Llama, AdamConfig, mixtures of token caches, orbax checkpoints.

No Dagster here: this runs inside Iris jobs and subprocesses. The public API:
`train(TrainLmConfig, output_path, settings=TrainerSettings(...))` and
`evaluate(checkpoint_path, datasets)`.

Names resolve lazily: the configs are part of every experiment, and a code location load
(each Dagster step's process) imports JAX, optax and orbax only when it trains or evaluates.
"""

from __future__ import annotations

from marin_dagster.lazy import lazy_exports

_EXPORTS = {
    "NAMED_CONFIGS": "config",
    "LlamaConfig": "config",
    "Qwen3Config": "config",
    "TrainerSettings": "config",
    "TrainLmConfig": "config",
    "llama_150m": "config",
    "llama_nano": "config",
    "llama_small_shakespeare": "config",
    "MixtureDataset": "data",
    "TrainInputError": "data",
    "EvalResult": "evaluation",
    "evaluate": "evaluation",
    "load_model": "evaluation",
    "MFU_FORMULA": "metrics",
    "training_flops_per_token": "metrics",
    "AdamConfig": "optim",
    "generate": "sample",
    "TrainingDivergedError": "trainer",
    "TrainResult": "trainer",
    "train": "trainer",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
