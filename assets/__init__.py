"""Asset factories and the experiments built from them.

The vocabulary of an experiment file (see assets/experiments/):
    corpus = sample_corpus("raw/shakespeare")   # or dataset("raw/x", "gs://b/x/*.jsonl.zst")
    tok    = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=8192)
    clean  = deduplicated("dedup/shakespeare", source=corpus, mode="fuzzy")
    ds     = tokenized("tokenized/shakespeare", source=clean, tokenizer=tok)
    model  = train_lm("checkpoints/nano-shakespeare", model=llama_nano, datasets={ds: 1.0}, ...)
"""

import assets.shadowing  # noqa: F401  (first: it checks what the imports below rely on)
from assets.dataset import as_dataset, dataset
from assets.dedup import deduplicated
from assets.experiment import Experiment
from assets.raw import sample_corpus
from assets.stats import dataset_stats
from assets.tokenize import tokenized, tokenizer
from assets.train import evaluate, train_lm
from assets.watched import folder_corpus, watched_folder

__all__ = [
    "Experiment",
    "as_dataset",
    "dataset",
    "dataset_stats",
    "deduplicated",
    "evaluate",
    "folder_corpus",
    "sample_corpus",
    "tokenized",
    "tokenizer",
    "train_lm",
    "watched_folder",
]
