"""Asset factories and the experiments built from them.

The vocabulary of an experiment file (see assets/experiments/):
    corpus = sample_corpus("raw/shakespeare")
"""

from assets.experiment import Experiment
from assets.raw import sample_corpus
from assets.stats import dataset_stats
from assets.watched import folder_corpus, watched_folder

__all__ = ["Experiment", "dataset_stats", "folder_corpus", "sample_corpus", "watched_folder"]
