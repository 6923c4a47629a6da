"""Asset factories and the experiments built from them.

The vocabulary of an experiment file (see assets/experiments/):
    corpus = sample_corpus("raw/shakespeare")
    tok    = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=8192)
    ds     = tokenized("tokenized/shakespeare", source=corpus, tokenizer=tok)
"""

from assets.dedup import deduplicated
from assets.experiment import Experiment
from assets.raw import sample_corpus
from assets.stats import dataset_stats
from assets.tokenize import tokenized, tokenizer
from assets.watched import folder_corpus, watched_folder

__all__ = [
    "Experiment",
    "dataset_stats",
    "deduplicated",
    "folder_corpus",
    "sample_corpus",
    "tokenized",
    "tokenizer",
    "watched_folder",
]
