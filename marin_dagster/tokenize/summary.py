"""What a built token cache shows: totals, bytes per token and a few decoded documents."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from marin_dagster import fs
from marin_dagster.markdown import code_block
from marin_dagster.tokenize.cache import LEDGER_NAME, TokenCache, read_cache_stats
from marin_dagster.tokenize.tokenizer import load_tokenizer


def decoded_samples(
    cache: TokenCache, tokenizer: str | Tokenizer, n: int = 3, max_chars: int = 300
) -> list[str]:
    """The first characters of ``n`` documents spread over the split, decoded."""
    tok = load_tokenizer(tokenizer)
    if len(cache) == 0 or n <= 0:
        return []
    picks = sorted({k * (len(cache) - 1) // max(n - 1, 1) for k in range(n)})
    out = []
    for i in picks:
        # Decode a prefix only: whole documents can be megabytes.
        ids = cache[i][: max_chars * 2].tolist()
        out.append(tok.decode(ids, skip_special_tokens=False)[:max_chars])
    return out


def summarize_cache(
    path: str, tokenizer: str | Tokenizer, n_samples: int = 3, max_chars: int = 300
) -> dict[str, Any]:
    """Totals per split (from .stats.json), bytes per token, decoded samples as markdown."""
    stats = read_cache_stats(path)
    if stats is None:
        raise FileNotFoundError(f"{path} has no .stats.json: the cache build did not finish")
    splits: dict[str, Any] = {}
    for split, s in stats.items():
        entry = dict(s)
        entry["bytes_per_token"] = (s["num_bytes"] / s["num_tokens"]) if s["num_tokens"] else None
        if fs.exists(fs.join(path, split, LEDGER_NAME)):
            cache = TokenCache.open(path, split)
            entry["num_shards"] = cache.num_shards
            entry["dtype"] = cache.dtype.name
            entry["eos_id"] = cache.eos_id
            entry["samples"] = decoded_samples(cache, tokenizer, n_samples, max_chars)
        splits[split] = entry
    md = []
    for split, entry in splits.items():
        for k, text in enumerate(entry.get("samples", [])):
            md.append(f"**{split} sample {k + 1}**\n\n{code_block(text)}")
    num_tokens = sum(s["num_tokens"] for s in stats.values())
    num_bytes = sum(s["num_bytes"] for s in stats.values())
    return {
        "splits": splits,
        "num_tokens": num_tokens,
        "num_docs": sum(s["num_docs"] for s in stats.values()),
        "num_bytes": num_bytes,
        "bytes_per_token": num_bytes / num_tokens if num_tokens else None,
        "samples_markdown": "\n\n".join(md),
    }
