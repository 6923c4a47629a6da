"""Asset factories and the experiments built from them.

The vocabulary of an experiment file (see assets/experiments/):
    corpus = sample_corpus("raw/shakespeare")
"""

from assets.experiment import Experiment
from assets.raw import sample_corpus

__all__ = ["Experiment", "sample_corpus"]
