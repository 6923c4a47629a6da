"""FLOPs, MFU and the metrics log (`metrics.jsonl`).

MFU = (training FLOPs per token x tokens per second) / peak FLOP/s of the devices used.
Training FLOPs per token (PaLM appendix B, as Levanter's `lm_flops_per_token`):
    6 * N_matmul + 12 * num_layers * num_heads * head_dim * seq_len
N_matmul counts the weights that multiply activations (attention and MLP
projections and the LM head; not the input embedding, which is a gather, nor
norm weights); the second term is QK^T and AV, forward and backward, with the
causal half not discounted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import jax

from marin_dagster import fs
from marin_dagster.levanter.config import LlamaConfig

# Dense bfloat16 peak FLOP/s per chip (vendor sheets), matched against device_kind.
_PEAK_BF16 = {
    "h200": 989e12,
    "h100": 989e12,
    "a100": 312e12,
    "l4": 121e12,
    "a10": 125e12,
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v6": 918e12,
}
# CPU estimate: cores x 2.5 GHz x 32 float32 FLOP/cycle (two 8-wide AVX2 FMA units).
_CPU_FLOPS_PER_CORE = 2.5e9 * 32


def matmul_params(config: LlamaConfig) -> int:
    d, i, hd, v = (
        config.hidden_dim,
        config.intermediate_dim,
        config.actual_head_dim,
        config.vocab_size or 0,
    )
    attn = d * hd * (config.num_heads + 2 * config.num_kv_heads) + config.num_heads * hd * d
    return config.num_layers * (attn + 3 * d * i) + d * v


def training_flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    attention = 12 * config.num_layers * config.num_heads * config.actual_head_dim * seq_len
    return 6.0 * matmul_params(config) + attention


MFU_FORMULA = (
    "MFU = (6*N_matmul + 12*num_layers*num_heads*head_dim*seq_len) * tokens_per_second / peak_flops; "
    "N_matmul = attention+MLP projections + LM head (input embedding excluded)"
)


def cpu_core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def peak_flops(devices: Sequence[jax.Device], per_device: float | None = None) -> float:
    """Peak FLOP/s of `devices` together. CPU devices share the process's cores, so they are not summed."""
    if per_device is not None:
        if devices and devices[0].platform == "cpu":
            return per_device
        return per_device * len(devices)
    if not devices or devices[0].platform == "cpu":
        return cpu_core_count() * _CPU_FLOPS_PER_CORE
    kind = devices[0].device_kind.lower()
    for key, value in _PEAK_BF16.items():
        if key in kind:
            return value * len(devices)
    raise ValueError(
        f"no peak FLOP/s known for device kind {devices[0].device_kind!r}; "
        "set peak_flops_per_device in the trainer settings"
    )


class MetricsLog:
    """Rows of `metrics.jsonl`, kept in memory and written atomically.

    The file is rewritten at each checkpoint and at the end, so after a kill it
    holds exactly the steps up to the checkpoint the rerun resumes from.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []

    def load_until(self, step: int, drop_eval_at_end: bool = False) -> None:
        """Keep the rows of an earlier run up to `step` (the checkpoint being resumed).

        `drop_eval_at_end`: the run had finished, and its final eval is about to be redone.
        """
        if not fs.exists(self.path):
            return
        text = fs.read_bytes(self.path).decode("utf-8")
        self.rows = [
            r
            for r in (json.loads(line) for line in text.splitlines() if line.strip())
            if r.get("step", 0) < step
            or (r.get("step", 0) == step and not (drop_eval_at_end and "loss" not in r))
        ]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        fs.write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))
