"""The default experiment: Shakespeare, end to end on a laptop (2 CPU cores, minutes).

python assets/experiments/shakespeare_nano.py     # materialize in-process
dagster job execute -m marin_dagster.definitions -j shakespeare_nano_job
"""

from assets import (
    Experiment,
    dataset_stats,
    deduplicated,
    evaluate,
    sample_corpus,
    tokenized,
    tokenizer,
    train_lm,
)
from marin_dagster.levanter import AdamConfig, llama_nano, llama_small_shakespeare

corpus = sample_corpus("raw/shakespeare")
tok = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=8192)
clean = deduplicated("dedup/shakespeare", source=corpus, mode="fuzzy")
ds = tokenized("tokenized/shakespeare", source=clean, tokenizer=tok)
nano = train_lm(
    "checkpoints/nano-shakespeare",
    version="v1",
    model=llama_nano,
    optimizer=AdamConfig(learning_rate=5e-4, weight_decay=0.1),
    datasets={ds: 1.0},
    batch_size=4,
    seq_len=512,
    num_train_steps=50,
    resources="cpu",
)
small = train_lm(
    "checkpoints/small-shakespeare",
    version="v1",
    model=llama_small_shakespeare,
    optimizer=AdamConfig(learning_rate=2e-3, weight_decay=0.1, warmup=10),
    datasets={ds: 1.0},
    batch_size=8,
    seq_len=256,
    num_train_steps=120,
    steps_per_eval=40,
    resources="cpu",
)
nano_eval = evaluate("eval/nano-shakespeare", checkpoint=nano, datasets=[ds])
small_eval = evaluate("eval/small-shakespeare", checkpoint=small, datasets=[ds])
stats = dataset_stats("stats/shakespeare", datasets=[corpus, clean, ds])

experiment = Experiment(
    "shakespeare_nano",
    leaves=[nano_eval, small_eval, stats],
    description="Shakespeare's plays and Milton's poems: raw corpus, fuzzy dedup, BPE tokenizer, "
    "token cache, llama_nano and a ~10M-parameter Llama, each evaluated.",
)

if __name__ == "__main__":
    experiment.materialize()
