"""Drop JSONL files into the inbox; the sensor builds their dataset, dedup and token cache.

The inbox is `{MARIN_PREFIX}/inbox` (./data/inbox by default; MARIN_INBOX overrides it). With
`dagster dev -w workspace.yaml` running, write files of `{"text": ...}` records there: once the
folder has been quiet for a couple of seconds, the `inbox__inbox_sensor` sensor requests
one run of everything below the folder (the records as a corpus, fuzzy dedup, a BPE tokenizer
trained on them, the token cache). A burst of files is one run; an emptied inbox is none.
"""

import os

from assets import Experiment, deduplicated, folder_corpus, tokenized, tokenizer, watched_folder
from marin_dagster import fs
from resources.storage import default_prefix


def inbox_path() -> str:
    if os.environ.get("MARIN_INBOX"):
        return os.environ["MARIN_INBOX"]
    prefix = default_prefix()
    # The sensor watches a local folder; with a bucket prefix the inbox stays on this machine.
    return os.path.join(prefix, "inbox") if fs.is_local(prefix) else "./inbox"


inbox = watched_folder("inbox", inbox_path(), description="JSONL files dropped by hand.")
corpus = folder_corpus("raw/inbox", source=inbox, pattern="*.jsonl")
clean = deduplicated("dedup/inbox", source=corpus, mode="fuzzy")
tok = tokenizer("tokenizers/inbox-bpe", source=clean, vocab_size=4096)
tokens = tokenized("tokenized/inbox", source=clean, tokenizer=tok)

experiment = Experiment(
    "inbox",
    leaves=[tokens],
    description="Whatever JSONL lands in the inbox folder: corpus, dedup, tokenizer, tokens.",
)
