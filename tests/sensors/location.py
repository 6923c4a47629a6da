"""A test code location: a watched folder, the corpus built from it, and its sensor.

Reads MARIN_WATCHED_DIR (the folder) and MARIN_PREFIX (outputs). The sensor
ticks every second and waits half a second of quiet, so a daemon test is quick.
"""

import os

import dagster as dg

from assets import Experiment, folder_corpus, watched_folder
from assets.sensors import watched_folder_sensor
from resources import local_resources

inbox = watched_folder("raw/inbox", os.environ["MARIN_WATCHED_DIR"])
corpus = folder_corpus("raw/inbox_corpus", source=inbox)
experiment = Experiment("inbox", leaves=[corpus], description="Text files dropped into a folder.")
sensor = watched_folder_sensor(inbox, experiment, minimum_interval_seconds=1, settle_s=0.5)

defs = dg.Definitions(
    assets=[
        a.with_attributes(group_names_by_key={a.key: experiment.name}) for a in experiment.assets()
    ],
    jobs=[experiment.job()],
    sensors=[sensor],
    resources=local_resources(),
)
