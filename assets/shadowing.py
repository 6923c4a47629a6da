"""Refuse a user's module that hides the project's `resources` package, at import.

A `resources.py` beside an experiment file comes first on sys.path: the project's imports of
`resources.*` then failed with "No module named 'resources.ducky'; 'resources' is not a
package", naming nothing of the user's. Imported first by `assets`, so it runs before them.
"""

from __future__ import annotations

import importlib.util
import os

_OURS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources")


def check_resources_package() -> None:
    spec = importlib.util.find_spec("resources")
    if spec is None:
        return  # not installed beside us: the import says so itself
    found = [os.path.abspath(p) for p in spec.submodule_search_locations or []]
    if _OURS not in found:
        raise ImportError(
            f"{spec.origin or ', '.join(found)} hides marin-dagster's `resources` package (the "
            "experiment file's folder comes first on sys.path): rename it"
        )


check_resources_package()
