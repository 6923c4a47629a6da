"""Configs with Levanter's field names: the model (`LlamaConfig`) and its named sizes, what
is trained (`TrainLmConfig`) and how the training runs (`TrainerSettings`).

`vocab_size` is left unset in the named configs: it comes from the tokenizer
(`config.with_vocab(n)`), as Levanter takes the vocabulary from the tokenizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from marin_dagster.execution.version import ADDED_LATER, UNVERSIONED, versioned_fields
from marin_dagster.levanter.data import TrainInputError
from marin_dagster.levanter.optim import AdamConfig
from marin_dagster.settings import setting
from marin_dagster.words import checked_keywords

ComputeDtype = Literal["float32", "bfloat16"]
COMPUTE_DTYPES = get_args(ComputeDtype)
# How parameters are placed on the devices (`mesh.state_shardings`).
Parallelism = Literal["data_parallel", "fsdp"]
PARALLELISMS = get_args(Parallelism)

# Activation memory (`TrainerSettings.remat`): what the backward pass keeps of each decoder block.
#   none   keep every intermediate (most memory)
#   block  keep only each block's input; recompute the block in the backward pass (least memory)
#   dots   keep the projections' matmul outputs; recompute norms, RoPE, SiLU and attention.
#          The trainer's default: the fastest measured on an H200 and on the CPU, since writing
#          and rereading the elementwise intermediates costs more than recomputing them
#          (docs/benchmarks.md).
Remat = Literal["none", "block", "dots"]
REMAT_POLICIES = get_args(Remat)


@checked_keywords
@dataclass(frozen=True)
class LlamaConfig:
    """A Llama decoder. `seq_len` is the longest sequence the model supports (RoPE positions)."""

    seq_len: int = 2048
    hidden_dim: int = 4096
    intermediate_dim: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    vocab_size: int | None = None
    head_dim: int | None = None
    initializer_range: float = 0.02
    layer_norm_epsilon: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    # RMSNorm over each head's queries and keys before RoPE (Qwen3's QK-norm).
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for name in (
            "seq_len",
            "hidden_dim",
            "intermediate_dim",
            "num_layers",
            "num_heads",
            "num_kv_heads",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}) "
                "for grouped-query attention"
            )
        if self.head_dim is None and self.hidden_dim % self.num_heads:
            raise ValueError(
                f"LlamaConfig.hidden_dim ({self.hidden_dim}) must be divisible by num_heads "
                f"({self.num_heads}), or set head_dim"
            )
        if self.actual_head_dim % 2:
            raise ValueError(f"LlamaConfig head_dim ({self.actual_head_dim}) must be even for RoPE")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"LlamaConfig.vocab_size must be positive, got {self.vocab_size}")

    @property
    def max_seq_len(self) -> int:
        """Levanter's newer name for `seq_len`."""
        return self.seq_len

    @property
    def actual_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_dim // self.num_heads

    def with_vocab(self, vocab_size: int) -> LlamaConfig:
        return dataclasses.replace(self, vocab_size=vocab_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"LlamaConfig: unknown fields {unknown}; known fields are {sorted(known)}"
            )
        return cls(**d)

    def num_parameters(self) -> int:
        """All parameters, the input embedding included (counted once when tied)."""
        if self.vocab_size is None:
            raise ValueError(
                "LlamaConfig.vocab_size is unset: call with_vocab(tokenizer vocab size)"
            )
        d, i, hd = self.hidden_dim, self.intermediate_dim, self.actual_head_dim
        attn = d * hd * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * hd * d
        layer = attn + 3 * d * i + 2 * d + (2 * hd if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * layer + d + head


def Qwen3Config(  # noqa: N802 - Levanter's class name, so Marin's experiment files run as written
    *,
    max_seq_len: int = 4096,
    rope_theta: float = 1_000_000.0,
    layer_norm_epsilon: float = 1e-6,
    **fields: Any,
) -> LlamaConfig:
    """Levanter's Qwen3Config: a Llama decoder with QK-norm, Qwen3's RoPE base and epsilon."""
    return LlamaConfig(
        seq_len=max_seq_len,
        rope_theta=rope_theta,
        layer_norm_epsilon=layer_norm_epsilon,
        qk_norm=True,
        **fields,
    )


# Marin's named sizes.
llama_nano = LlamaConfig(
    seq_len=512, hidden_dim=32, intermediate_dim=128, num_heads=2, num_kv_heads=2, num_layers=2
)
llama_150m = LlamaConfig(
    seq_len=1024, hidden_dim=512, intermediate_dim=1792, num_heads=8, num_kv_heads=8, num_layers=6
)
# ~10.5M parameters with an 8192-token vocabulary: big enough to learn visible
# English from Shakespeare, small enough for a few hundred steps on 2 CPU cores.
llama_small_shakespeare = LlamaConfig(
    seq_len=512, hidden_dim=256, intermediate_dim=1024, num_heads=4, num_kv_heads=4, num_layers=6
)

NAMED_CONFIGS: dict[str, LlamaConfig] = {
    "llama_nano": llama_nano,
    "llama_150m": llama_150m,
    "llama_small_shakespeare": llama_small_shakespeare,
}


@checked_keywords
@dataclass(frozen=True)
class TrainLmConfig:
    """What is trained: a `train_lm` step's config. Every field changes the result, and so the
    step's version, except the two that say how often the run is saved (`checkpoint_every_steps`,
    `keep`)."""

    model: LlamaConfig
    # Mixture weight per dataset: token cache paths to `train`; in an experiment, the tokenized
    # assets' names, which the step replaces by their paths when it runs (as Marin replaces
    # `output_path_of` references).
    datasets: Mapping[str, float]
    optimizer: AdamConfig = field(default_factory=AdamConfig)
    batch_size: int = 8
    seq_len: int | None = None  # default: model.seq_len
    num_train_steps: int = 100
    seed: int = 0
    # PaLM's z-loss weight (Levanter's `z_loss_weight`): weight * log(Z)^2 per token keeps the
    # logits' scale in check. None: off.
    z_loss_weight: float | None = None
    # Validation sets {name: cache path}, read from `validation_split`. None: the
    # validation split of every training dataset that has one.
    validation: Mapping[str, str] | None = None
    validation_split: str = "validation"
    train_split: str = "train"
    steps_per_eval: int | None = None  # None: only at the end
    max_eval_batches: int | None = 16
    # The tokenizer's vocabulary size; sets model.vocab_size when that is unset.
    tokenizer_vocab_size: int | None = None
    data_block_size: int = 2048
    # What matmuls run in (parameters and optimizer state stay float32). Here, not in a run's
    # settings, because it changes the trained model: a bfloat16 run is another version.
    compute_dtype: ComputeDtype = field(default="float32", metadata=ADDED_LATER)
    # None: TrainerSettings' (a run's resource); set here for one step.
    checkpoint_every_steps: int | None = field(default=None, metadata=UNVERSIONED)
    keep: int | None = field(default=None, metadata=UNVERSIONED)

    def __post_init__(self) -> None:
        if not isinstance(self.model, LlamaConfig):
            raise TrainInputError(
                f"model must be a LlamaConfig, got {self.model!r}; import one "
                f"(from marin_dagster.levanter import {', '.join(NAMED_CONFIGS)}) or build "
                "one with LlamaConfig(...) / Qwen3Config(...)"
            )
        if not self.datasets:
            raise TrainInputError("datasets is empty; give {dataset: weight}")
        for name, weight in self.datasets.items():
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not 0 < weight < math.inf
            ):
                raise TrainInputError(
                    f"datasets[{name!r}]: mixture weight must be a positive number, "
                    f"got {weight!r}; drop the dataset instead of giving it weight 0"
                )
        if not isinstance(self.optimizer, AdamConfig):
            raise TrainInputError(
                f"optimizer must be an AdamConfig, got {type(self.optimizer).__name__} "
                f"{self.optimizer!r}; write optimizer=AdamConfig(learning_rate=...) "
                "(from marin_dagster.levanter import AdamConfig)"
            )
        # Types first: a string where a number goes failed later in a comparison, or in JAX,
        # without the field's name.
        for name, optional in (
            ("seq_len", True),
            ("seed", False),
            ("batch_size", False),
            ("num_train_steps", False),
            ("data_block_size", False),
            ("steps_per_eval", True),
            ("max_eval_batches", True),
            ("checkpoint_every_steps", True),
            ("keep", True),
        ):
            value = getattr(self, name)
            if (value is None and not optional) or (
                value is not None and (not isinstance(value, int) or isinstance(value, bool))
            ):
                raise TrainInputError(
                    f"{name} must be an integer{' or None' if optional else ''}, got "
                    f"{type(value).__name__} {value!r}"
                )
        for name in ("train_split", "validation_split"):
            if not isinstance(getattr(self, name), str):
                raise TrainInputError(f"{name} must be a split name, got {getattr(self, name)!r}")
        if self.seq_len is not None and self.seq_len < 2:
            raise TrainInputError(
                f"seq_len must be at least 2 (a token and its target), got {self.seq_len}"
            )
        if self.train_seq_len > self.model.seq_len:
            raise TrainInputError(
                f"seq_len={self.train_seq_len} is above the model's maximum "
                f"(model.seq_len={self.model.seq_len}); lower seq_len or use a model "
                "config with a longer seq_len"
            )
        for name in ("batch_size", "num_train_steps", "data_block_size"):
            if getattr(self, name) < 1:
                raise TrainInputError(
                    f"{name} must be a positive integer, got {getattr(self, name)!r}"
                )
        if self.z_loss_weight is not None and not (
            isinstance(self.z_loss_weight, int | float) and 0 <= self.z_loss_weight < math.inf
        ):
            raise TrainInputError(
                f"z_loss_weight must be a non-negative number or None, got {self.z_loss_weight!r}"
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise TrainInputError(
                f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.compute_dtype!r}"
            )
        for name in ("steps_per_eval", "max_eval_batches", "checkpoint_every_steps", "keep"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainInputError(f"{name} must be positive or None, got {value}")

    @property
    def train_seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else self.model.seq_len

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["datasets"] = dict(self.datasets)
        d["validation"] = None if self.validation is None else dict(self.validation)
        return d

    def result_fields(self) -> dict[str, Any]:
        """The fields that decide the result (all but the checkpoint policy), comparable as JSON."""
        return versioned_fields(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainLmConfig:
        d = dict(d)
        d["model"] = LlamaConfig.from_dict(d["model"])
        d["optimizer"] = AdamConfig.from_dict(d["optimizer"])
        return cls(**d)


@checked_keywords
@dataclass(frozen=True)
class TrainerSettings:
    """How a training runs, not what it computes: `LevanterResource` is derived from these."""

    num_devices: int | None = setting(None, "devices in the mesh; None: all local devices")
    parallelism: Parallelism = setting(
        "data_parallel",
        "data_parallel (replicated parameters) or fsdp (parameters sharded over devices)",
    )
    remat: Remat = setting(
        "dots",
        "activation memory: none, block or dots (recompute all but the matmuls; "
        "the fastest measured, docs/benchmarks.md)",
    )
    checkpoint_every_steps: int | None = setting(
        None,
        "save every N steps; None: every tenth of the run, so a killed run loses at most a tenth",
    )
    checkpoint_every_minutes: float | None = setting(10.0, "save every N minutes as well")
    keep: int | None = setting(2, "checkpoints kept (None: all)")
    log_every: int = setting(
        10, "log loss, learning rate, grad norm, tokens/s and MFU every N steps"
    )
    peak_flops_per_device: float | None = setting(
        None, "peak FLOP/s per device for MFU; None: known accelerators, or a CPU estimate"
    )
    sample_tokens: int = setting(64, "tokens generated for the sample after training")
    sample_temperature: float = setting(0.8, "0 for greedy sampling")

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ValueError(f"parallelism must be one of {PARALLELISMS}, got {self.parallelism!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ValueError(
                f"checkpoint_every_steps must be positive or None, got {self.checkpoint_every_steps}"
            )
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")
