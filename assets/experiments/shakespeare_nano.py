"""The default experiment: Shakespeare, end to end on a laptop.

    python assets/experiments/shakespeare_nano.py     # materialize in-process
    dagster job execute -w workspace.yaml -j shakespeare_nano_job
"""

from assets import Experiment, sample_corpus

corpus = sample_corpus("raw/shakespeare")

experiment = Experiment(
    "shakespeare_nano",
    leaves=[corpus],
    description="Shakespeare's plays and Milton's poems: raw corpus (later: dedup, tokenizer, "
                "tokenized cache, llama_nano checkpoint).",
)

if __name__ == "__main__":
    experiment.materialize()
