"""The `marin` console script."""

from __future__ import annotations

import argparse
import logging
import sys

from marin_dagster.execution.instance import ensure_home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marin", description="marin-dagster utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="create DAGSTER_HOME (default ./.dagster) with its dagster.yaml")
    init.add_argument("home", nargs="?", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "init":
        home = ensure_home(args.home)
        sys.stdout.write(f"DAGSTER_HOME={home}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
