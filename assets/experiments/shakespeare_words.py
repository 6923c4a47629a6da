"""An experiment file written with Marin's step API, on the default experiment's data.

Marin users write steps as `ExecutorStep(name, fn, config)`: `fn` is a plain function of its
config, `versioned(...)` marks what changes the output, `output_path_of(...)` wires inputs
(here the deduplicated corpus of the default experiment, a factory's asset) and
`this_output_path()` is the step's own folder. Each step is a Dagster asset with Marin's
version and skip.

python assets/experiments/shakespeare_words.py          # executor_main: builds what is missing
python assets/experiments/shakespeare_words.py --dry_run true
dagster job execute -m marin_dagster.definitions -j shakespeare_words_job
"""

import collections
import dataclasses
import re

from assets import Experiment
from assets.experiments.shakespeare_nano import clean
from marin_dagster import fs
from marin_dagster.datasets.files import dataset_files
from marin_dagster.marin import (
    ExecutorStep,
    executor_main,
    lower,
    output_path_of,
    this_output_path,
    versioned,
)
from marin_dagster.tokenize.records import read_records


@dataclasses.dataclass(frozen=True)
class WordCountConfig:
    input_path: str
    output_path: str
    top_k: int = 100
    min_length: int = 1
    log_every: int = 1000  # not versioned: changing it reruns nothing


def count_words(config: WordCountConfig) -> None:
    counts: collections.Counter[str] = collections.Counter()
    documents = 0
    for path in dataset_files(config.input_path):
        for _, _, record in read_records(path):
            if isinstance(record, dict) and isinstance(record.get("text"), str):
                documents += 1
                words = re.findall(r"[a-z']+", record["text"].lower())
                counts.update(w for w in words if len(w) >= config.min_length)
    fs.write_json(
        fs.join(config.output_path, "words.json"),
        {"documents": documents, "distinct": len(counts), "top": counts.most_common(config.top_k)},
    )


def write_summary(config: dict) -> None:
    words = fs.read_json(fs.join(config["words"], "words.json"))
    lines = [f"{w}\t{n}" for w, n in words["top"][: config["lines"]]]
    fs.write_text(fs.join(config["output"], "summary.tsv"), "\n".join(lines) + "\n")


word_counts = ExecutorStep(
    name="analysis/shakespeare-words",
    fn=count_words,
    config=WordCountConfig(
        input_path=output_path_of(clean),
        output_path=this_output_path(),
        top_k=versioned(200),
        min_length=versioned(3),
    ),
    description="The most frequent words of the deduplicated Shakespeare corpus.",
)
summary = ExecutorStep(
    name="analysis/shakespeare-summary",
    fn=write_summary,
    config={
        "words": output_path_of(word_counts),
        "output": this_output_path(),
        "lines": versioned(20),
    },
    description="The top words as a TSV.",
)

experiment = Experiment(
    "shakespeare_words",
    leaves=[lower(summary)],
    description="Word counts of the deduplicated corpus, written as Marin ExecutorSteps.",
)

if __name__ == "__main__":
    executor_main(steps=[summary])
