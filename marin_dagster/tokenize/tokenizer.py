"""Tokenizers: train a byte-level BPE, save it, load one (file, directory or hub name).

A saved tokenizer is a directory holding ``tokenizer.json`` (the
`tokenizers` library's own format, loadable by Hugging Face and Levanter) and
``tokenizer_config.json`` (how it was trained and which token is EOS).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from marin_dagster import fs

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
DEFAULT_EOS = "<|endoftext|>"
# Tried in order when a tokenizer does not say which token ends a document.
KNOWN_EOS = (DEFAULT_EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")
# Texts handed to the trainer per batch: the Rust side counts words as they
# arrive, so only one batch of text is held in Python at a time.
_TRAIN_BATCH = 256


class TokenizerNotFoundError(FileNotFoundError):
    """A tokenizer path that does not exist."""


class TokenizerHubUnreachableError(ConnectionError):
    """A hub tokenizer name given while the hub cannot be reached."""


@dataclass(frozen=True)
class BpeTrainingConfig:
    """How a byte-level BPE is trained (the tokenizer asset's config)."""

    vocab_size: int = 8192
    special_tokens: tuple[str, ...] = (DEFAULT_EOS,)
    min_frequency: int = 2
    eos_token: str = DEFAULT_EOS
    # Cap on training documents (None: the whole source); the first N in order.
    max_documents: int | None = None

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(self.special_tokens):
            raise ValueError(
                f"vocab_size {self.vocab_size} is too small: a byte-level BPE needs the 256 "
                f"byte symbols plus {len(self.special_tokens)} special tokens"
            )
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.eos_token and self.eos_token not in self.special_tokens:
            raise ValueError(
                f"eos_token {self.eos_token!r} must be one of special_tokens {list(self.special_tokens)}"
            )


@dataclass
class TrainedTokenizer:
    """A trained tokenizer and where it was saved."""

    tokenizer: Tokenizer
    path: str  # the directory holding tokenizer.json and tokenizer_config.json
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer_json(self) -> str:
        return fs.join(self.path, TOKENIZER_FILE)


def new_byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE (GPT-2 style, no normalizer: lossless round trip)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _batched(
    texts: Iterable[str], size: int, limit: int | None, counts: dict[str, int]
) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        if limit is not None and counts["documents"] >= limit:
            break
        if not isinstance(text, str):
            raise TypeError(
                f"tokenizer training text #{counts['documents']} is {type(text).__name__}, "
                "not str: give an iterator of strings (the source's text field)"
            )
        counts["documents"] += 1
        counts["bytes"] += len(text.encode("utf-8", errors="surrogatepass"))
        batch.append(text)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def train_bpe(texts: Iterable[str], config: BpeTrainingConfig) -> tuple[Tokenizer, dict[str, Any]]:
    """Train a byte-level BPE from ``texts``, streamed batch by batch."""
    tok = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    counts = {"documents": 0, "bytes": 0}
    tok.train_from_iterator(
        _batched(texts, _TRAIN_BATCH, config.max_documents, counts), trainer=trainer
    )
    if counts["documents"] == 0:
        raise ValueError("no training text: the source yielded no documents")
    info = {
        "model": "byte-level-bpe",
        **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "actual_vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "eos_id": tok.token_to_id(config.eos_token) if config.eos_token else None,
        "num_training_documents": counts["documents"],
        "num_training_bytes": counts["bytes"],
    }
    return tok, info


def save_tokenizer(tok: Tokenizer, output_dir: str, config: dict[str, Any]) -> TrainedTokenizer:
    """Write tokenizer.json then tokenizer_config.json, each atomically."""
    output_dir = fs.normalize(output_dir)
    fs.write_text(fs.join(output_dir, TOKENIZER_FILE), tok.to_str(pretty=False))
    fs.write_json(fs.join(output_dir, CONFIG_FILE), config)
    return TrainedTokenizer(tok, output_dir, config)


def train_tokenizer(
    texts: Iterable[str], output_dir: str, config: BpeTrainingConfig | None = None, **overrides: Any
) -> TrainedTokenizer:
    """Train a byte-level BPE on ``texts`` (streamed) and save it under ``output_dir``.

    ``overrides`` are BpeTrainingConfig fields (vocab_size=..., special_tokens=...).
    """
    base = config or BpeTrainingConfig()
    if overrides:
        if "special_tokens" in overrides:
            overrides["special_tokens"] = tuple(overrides["special_tokens"])
        base = BpeTrainingConfig(**{**asdict(base), **overrides})
    tok, info = train_bpe(texts, base)
    return save_tokenizer(tok, output_dir, info)


def train_tokenizer_from_files(
    source_files: Sequence[str],
    output_dir: str,
    config: BpeTrainingConfig | None = None,
    *,
    text_key: str = "text",
    id_key: str | None = "id",
    held_out_fraction: float = 0.05,
    max_held_out_docs: int = 16,
    skip_bad_records: bool = False,
    n_examples: int = 3,
    **overrides: Any,
) -> TrainedTokenizer:
    """Train on the documents of ``source_files`` (JSONL/Parquet shards), streamed.

    Documents whose id hashes into ``held_out_fraction`` (the same hash as the
    token cache's validation split) are kept out of training; up to
    ``max_held_out_docs`` of them measure bytes per token. The result's
    config (also in tokenizer_config.json) holds ``bytes_per_token`` (None when
    no document was held out), ``held_out_docs``, ``examples`` and record counts.
    """
    from marin_dagster.tokenize.records import RecordCounts, iter_texts

    counts = RecordCounts()
    held: list[Any] = []
    texts = iter_texts(
        source_files,
        text_key,
        id_key,
        skip_bad_records=skip_bad_records,
        counts=counts,
        held_out_fraction=held_out_fraction,
        held_out_docs=held,
        max_held_out=max_held_out_docs,
    )
    base = config or BpeTrainingConfig()
    if overrides:
        if "special_tokens" in overrides:
            overrides["special_tokens"] = tuple(overrides["special_tokens"])
        base = BpeTrainingConfig(**{**asdict(base), **overrides})
    tok, info = train_bpe(texts, base)
    held_texts = [d.text for d in held]
    info.update(
        {
            "held_out_fraction": held_out_fraction,
            "held_out_docs": len(held_texts),
            "bytes_per_token": bytes_per_token(tok, held_texts) if held_texts else None,
            "examples": encode_examples(tok, held_texts, n_examples),
            "num_records": counts.records,
            "num_empty": counts.empty,
            "num_bad": counts.bad,
        }
    )
    return save_tokenizer(tok, output_dir, info)


def _looks_like_path(spec: str) -> bool:
    return (
        "://" in spec
        or spec.endswith(".json")
        or spec.startswith((".", "/", "~"))
        or os.path.exists(os.path.expanduser(spec))
    )


def _hub_endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        return endpoint
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:
        return "https://huggingface.co"


def _hub_reachable(endpoint: str, timeout: float = 5.0) -> str | None:
    """None when a TCP connection to the hub opens, else why not."""
    parsed = urllib.parse.urlparse(endpoint)
    host = parsed.hostname or endpoint
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port}: {e}"


def _hub_error(name: str, why: str) -> TokenizerHubUnreachableError:
    return TokenizerHubUnreachableError(
        f"tokenizer {name!r} is not a file or directory, so it was taken as a Hugging Face hub "
        f"name, but the hub is unreachable ({why}). Set the tokenizer setting to a local path "
        f"(a {TOKENIZER_FILE} file or a directory holding one, e.g. the output of a trained "
        "tokenizer asset), or run where the hub is reachable (HF_ENDPOINT may point at a mirror; "
        "HF_HUB_OFFLINE=1 forbids the hub)."
    )


def load_tokenizer(spec: str | Tokenizer) -> Tokenizer:
    """A tokenizer from a tokenizer.json path, a directory holding one, or a hub name.

    Paths may be local or fsspec URLs (gs://...). A hub name is fetched with
    ``Tokenizer.from_pretrained`` and fails fast, with what to change, when the
    hub cannot be reached.
    """
    if isinstance(spec, Tokenizer):
        return spec
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"tokenizer must be a path or hub name, got {spec!r}")
    if _looks_like_path(spec):
        path = fs.normalize(spec)
        candidate = path if path.endswith(".json") else fs.join(path, TOKENIZER_FILE)
        if not fs.exists(candidate):
            raise TokenizerNotFoundError(
                f"no tokenizer at {candidate}: give the path of a {TOKENIZER_FILE} (or of the "
                "directory holding it), or train one first"
            )
        try:
            return Tokenizer.from_str(fs.read_bytes(candidate).decode("utf-8"))
        except Exception as e:
            raise ValueError(f"{candidate} is not a valid {TOKENIZER_FILE}: {e}") from e
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise _hub_error(spec, "HF_HUB_OFFLINE is set")
    why = _hub_reachable(_hub_endpoint())
    if why is not None:
        raise _hub_error(spec, why)
    try:
        return Tokenizer.from_pretrained(spec)
    except Exception as e:
        raise _hub_error(spec, f"{type(e).__name__}: {e}") from e


def read_tokenizer_config(spec: str) -> dict[str, Any] | None:
    """The tokenizer_config.json beside a saved tokenizer, if there is one."""
    if not _looks_like_path(spec):
        return None
    path = fs.normalize(spec)
    directory = path.rsplit("/", 1)[0] if path.endswith(".json") else path
    return fs.read_json_or_none(fs.join(directory, CONFIG_FILE))


def find_eos_id(tok: Tokenizer, eos_token: str | None = None) -> int | None:
    """The id of ``eos_token``, or of the first well-known EOS token the vocabulary has."""
    if eos_token is not None:
        tid = tok.token_to_id(eos_token)
        if tid is None:
            raise ValueError(f"eos_token {eos_token!r} is not in the tokenizer's vocabulary")
        return tid
    for candidate in KNOWN_EOS:
        tid = tok.token_to_id(candidate)
        if tid is not None:
            return tid
    return None


def vocab_size(tok: Tokenizer) -> int:
    """Ids run 0..vocab_size-1, added tokens included."""
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(max(vocab.values(), default=-1) + 1, tok.get_vocab_size(with_added_tokens=True))


def token_byte_lengths(tok: Tokenizer) -> np.ndarray | None:
    """The source UTF-8 bytes each token id stands for (0 for special tokens), indexed by id,
    so bits per byte can count the bytes of exactly the tokens evaluated.

    Byte-level tokenizers only (a ByteLevel decoder: this project's BPE, GPT-2, Llama 3,
    Qwen): each character of their pieces is one byte. None for others (SentencePiece,
    WordPiece), whose pieces do not map to source bytes one to one.
    """
    if not isinstance(tok.decoder, decoders.ByteLevel):
        return None
    lengths = np.zeros(vocab_size(tok), dtype=np.int64)
    for piece, tid in tok.get_vocab(with_added_tokens=False).items():
        lengths[tid] = len(piece)
    for tid, added in tok.get_added_tokens_decoder().items():
        # Added tokens are matched in the raw text, not byte-level encoded.
        lengths[tid] = 0 if added.special else len(added.content.encode("utf-8"))
    return lengths


def bytes_per_token(tok: Tokenizer, texts: Sequence[str]) -> float:
    """UTF-8 bytes of ``texts`` per token the tokenizer makes of them (higher compresses more)."""
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("bytes_per_token needs at least one non-empty text")
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return n_bytes / max(n_tokens, 1)


def encode_examples(
    tok: Tokenizer, texts: Sequence[str], n: int = 3, max_chars: int = 200
) -> list[dict[str, Any]]:
    """A few texts with their tokens and decoding, for metadata and eyeballing."""
    out = []
    for text in [t for t in texts if t][:n]:
        snippet = text[:max_chars]
        enc = tok.encode(snippet, add_special_tokens=False)
        out.append(
            {
                "text": snippet,
                "ids": list(enc.ids),
                "tokens": list(enc.tokens),
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            }
        )
    return out


def describe_tokenizer(
    tok: Tokenizer, held_out: Sequence[str], n_examples: int = 3
) -> dict[str, Any]:
    """What the tokenizer asset shows: vocabulary size, bytes/token, examples."""
    return {
        "vocab_size": vocab_size(tok),
        "eos_id": find_eos_id(tok),
        "bytes_per_token": bytes_per_token(tok, held_out),
        "examples": encode_examples(tok, held_out, n_examples),
    }


def examples_markdown(examples: Sequence[dict[str, Any]]) -> str:
    """``encode_examples`` output as a markdown list."""
    lines = []
    for ex in examples:
        lines.append(f"- text: `{json.dumps(ex['text'])[1:-1][:200]}`")
        lines.append(f"  - tokens ({len(ex['ids'])}): `{' | '.join(ex['tokens'])[:300]}`")
        lines.append(f"  - decoded: `{json.dumps(ex['decoded'])[1:-1][:200]}`")
    return "\n".join(lines)
