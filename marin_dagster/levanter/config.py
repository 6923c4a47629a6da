"""Configs with Levanter's field names: the model (`LlamaConfig`) and its named sizes.

`vocab_size` is left unset in the named configs: it comes from the tokenizer
(`config.with_vocab(n)`), as Levanter takes the vocabulary from the tokenizer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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

    def __post_init__(self) -> None:
        for name in ("seq_len", "hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads"):
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
            raise ValueError(f"LlamaConfig: unknown fields {unknown}; known fields are {sorted(known)}")
        return cls(**d)

    def num_parameters(self) -> int:
        """All parameters, the input embedding included (counted once when tied)."""
        if self.vocab_size is None:
            raise ValueError("LlamaConfig.vocab_size is unset: call with_vocab(tokenizer vocab size)")
        d, i, hd = self.hidden_dim, self.intermediate_dim, self.actual_head_dim
        attn = d * hd * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * hd * d
        layer = attn + 3 * d * i + 2 * d
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * layer + d + head


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
