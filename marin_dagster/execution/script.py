"""Runs started from an experiment file: refused while that file is being imported.

An experiment file that calls `materialize()` or `executor_main()` at its top level, with no
`if __name__ == "__main__":` around it, ran every step each time anything imported it:
`dagster asset list -f exp.py`, the UI's code server at each reload, `import exp`.
"""

from __future__ import annotations

import sys

_OWN = ("assets.", "marin_dagster.")


def _ours(module: str) -> bool:
    # The shipped experiment files are experiment files like a user's.
    return module.startswith(_OWN) and not module.startswith("assets.experiments.")


def refuse_import_time_run(what: str) -> None:
    """Raise when the first caller outside this project runs at the top level of a module
    being imported (not the script Python runs, a notebook cell or a function)."""
    frame = sys._getframe(1)
    while frame is not None and _ours(str(frame.f_globals.get("__name__", ""))):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "<module>":
        return
    module = frame.f_globals.get("__name__")
    if module == "__main__":
        return
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    raise RuntimeError(
        f"{where}: {what} runs while module {module!r} is being imported (by `dagster`, its "
        "code server, or an import), so every load would run the experiment; put the call "
        'under `if __name__ == "__main__":` and run the file with python'
    )
