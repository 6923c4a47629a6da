"""`AdamConfig`: Levanter's AdamW optimizer config and learning-rate schedule, built on optax.

optax and JAX are imported where the optimizer is built: the config is part of every
experiment, and each code location load (each Dagster step's process) would otherwise pay
for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from marin_dagster.words import checked_keywords

if TYPE_CHECKING:
    import jax
    import optax

LrSchedule = Literal["cosine", "linear", "constant", "inv_sqrt"]
_SCHEDULES = ("cosine", "linear", "constant", "inv_sqrt")
# Parameters that get weight decay: the projection matrices. Norm weights and the
# token embedding do not (the model has no biases), as in Levanter.
_DECAYED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


@checked_keywords
@dataclass(frozen=True)
class AdamConfig:
    learning_rate: float = 6e-4
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    # Fraction of num_train_steps when < 1, else a step count.
    warmup: float = 0.01
    # Steps (or fraction) of decay at the end; None: decay over every step after warmup.
    decay: float | None = None
    lr_schedule: LrSchedule = "cosine"
    beta1: float = 0.9
    beta2: float = 0.95
    epsilon: float = 1e-8
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "lr_schedule" or (value is None and f.name in ("decay", "max_grad_norm")):
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                # A string ("1e-3") failed later in a comparison that named no field.
                raise ValueError(
                    f"AdamConfig.{f.name} must be a number, got {type(value).__name__} {value!r}"
                )
        if self.lr_schedule not in _SCHEDULES:
            raise ValueError(
                f"AdamConfig.lr_schedule must be one of {_SCHEDULES}, got {self.lr_schedule!r}"
            )
        if self.learning_rate <= 0:
            raise ValueError(f"AdamConfig.learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"AdamConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup < 0:
            raise ValueError(f"AdamConfig.warmup must be >= 0, got {self.warmup}")
        if self.decay is not None and self.decay < 0:
            raise ValueError(f"AdamConfig.decay must be >= 0 or None, got {self.decay}")
        if self.weight_decay < 0:
            raise ValueError(f"AdamConfig.weight_decay must be >= 0, got {self.weight_decay}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AdamConfig:
        return cls(**d)

    def _steps(self, value: float, num_train_steps: int) -> int:
        return int(value) if value >= 1 else int(round(value * num_train_steps))

    def lr_scheduler(self, num_train_steps: int) -> optax.Schedule:
        import optax

        lr, min_lr = self.learning_rate, self.learning_rate * self.min_lr_ratio
        warmup_steps = min(self._steps(self.warmup, num_train_steps), num_train_steps)
        if self.decay is None:
            decay_steps = num_train_steps - warmup_steps
        else:
            decay_steps = min(
                self._steps(self.decay, num_train_steps), num_train_steps - warmup_steps
            )
        stable_steps = num_train_steps - warmup_steps - decay_steps

        schedules: list[optax.Schedule] = []
        boundaries: list[int] = []
        if warmup_steps:
            schedules.append(optax.linear_schedule(0.0, lr, warmup_steps))
            boundaries.append(warmup_steps)
        if stable_steps:
            schedules.append(optax.constant_schedule(lr))
            boundaries.append(warmup_steps + stable_steps)
        decay_len = max(decay_steps, 1)
        if self.lr_schedule == "constant":
            schedules.append(optax.constant_schedule(lr))
        elif self.lr_schedule == "cosine":
            schedules.append(optax.cosine_decay_schedule(lr, decay_len, alpha=self.min_lr_ratio))
        elif self.lr_schedule == "linear":
            schedules.append(optax.linear_schedule(lr, min_lr, decay_len))
        else:
            schedules.append(_inv_sqrt_schedule(lr, min_lr, warmup_steps))
        if len(schedules) == 1:
            return schedules[0]
        return optax.join_schedules(schedules, boundaries)

    def build(self, num_train_steps: int) -> optax.GradientTransformation:
        import optax

        chain: list[optax.GradientTransformation] = []
        if self.max_grad_norm is not None:
            chain.append(optax.clip_by_global_norm(self.max_grad_norm))
        chain.append(optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon))
        if self.weight_decay > 0:
            chain.append(optax.add_decayed_weights(self.weight_decay, mask=weight_decay_mask))
        chain.append(optax.scale_by_learning_rate(self.lr_scheduler(num_train_steps)))
        return optax.chain(*chain)


def _inv_sqrt_schedule(
    lr: float, min_lr: float, warmup_steps: int, timescale: float = 10000
) -> optax.Schedule:
    import jax.numpy as jnp

    def schedule(count: jax.Array) -> jax.Array:
        decay = jnp.minimum(1.0, 1.0 / jnp.sqrt(jnp.maximum(count + warmup_steps, 1) / timescale))
        return jnp.maximum(lr * decay, min_lr)

    return schedule


def weight_decay_mask(params: Any) -> Any:
    """True for the leaves that get weight decay (projection matrices only)."""
    import jax

    def decayed(path: tuple[Any, ...], _leaf: Any) -> bool:
        name = getattr(path[-1], "key", None)
        return name in _DECAYED

    return jax.tree_util.tree_map_with_path(decayed, params)
