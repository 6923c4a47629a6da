"""A process of a multi-host training other than process 0:
`python -m marin_dagster.levanter.follower`.

It joins the training (`distributed.initialize_from_env`, from the launcher's environment),
reads what process 0 publishes and trains it with process 0 (see `distributed.py`).
"""

from __future__ import annotations

import logging

from marin_dagster.levanter import distributed


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    distributed.follow()


if __name__ == "__main__":
    main()
