"""Levanter-style training in JAX: Llama, AdamConfig, mixtures of token caches, orbax checkpoints.

No Dagster here: this runs inside Iris jobs and subprocesses. The public API:
`train(TrainLmConfig, output_path, settings=TrainerSettings(...))` and
`evaluate(checkpoint_path, datasets)`.
"""

from marin_dagster.levanter.config import (
    NAMED_CONFIGS,
    LlamaConfig,
    Qwen3Config,
    TrainerSettings,
    TrainLmConfig,
    llama_150m,
    llama_nano,
    llama_small_shakespeare,
)
from marin_dagster.levanter.data import MixtureDataset, TrainInputError
from marin_dagster.levanter.evaluate import EvalResult, evaluate, load_model
from marin_dagster.levanter.metrics import MFU_FORMULA, training_flops_per_token
from marin_dagster.levanter.optim import AdamConfig
from marin_dagster.levanter.sample import generate
from marin_dagster.levanter.trainer import TrainingDivergedError, TrainResult, train

__all__ = [
    "Qwen3Config",
    "MFU_FORMULA",
    "NAMED_CONFIGS",
    "AdamConfig",
    "TrainInputError",
    "EvalResult",
    "LlamaConfig",
    "MixtureDataset",
    "TrainLmConfig",
    "TrainResult",
    "TrainerSettings",
    "TrainingDivergedError",
    "evaluate",
    "generate",
    "llama_150m",
    "llama_nano",
    "llama_small_shakespeare",
    "load_model",
    "train",
    "training_flops_per_token",
]
