"""A process of a multi-host training other than process 0:
`python -m marin_dagster.levanter.follower`.

It joins the training (`distributed.initialize_from_env`, from the launcher's environment),
reads what process 0 publishes and trains it with process 0 (see `distributed.py`).
"""

from __future__ import annotations

import logging

from marin_dagster.levanter import distributed


def main() -> None:
    # Our own logs only, as process 0 (a Dagster step, whose root logger stays at WARNING):
    # at INFO, orbax's absl lines ("[process=1] ...") fill the console, a few hundred a run.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("marin_dagster").setLevel(logging.INFO)
    distributed.follow()


if __name__ == "__main__":
    main()
