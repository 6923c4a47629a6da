"""Prefetch: run an Arrow-batch iterator a few steps ahead in a thread.

Arrow's readers, compute kernels and Parquet writer release the GIL, so inside
one worker the next block can be parsed while the user's vectorized function
runs and the last batch is written: three cores' worth of work instead of one
after another. Only batch streams are prefetched; record-wise Python holds the
GIL, where a thread would only add switching.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Iterator
from typing import Any

_ITEM, _DONE, _ERROR = 0, 1, 2


def prefetch(it: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Yield what `it` yields, computed up to `depth` items ahead in a thread.

    The thread runs in a copy of the caller's context, so counters and shared
    objects work inside it; an exception it meets is raised here, unchanged.
    Closing the generator early stops the thread and closes `it`.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for x in it:
                if not put((_ITEM, x)):
                    return
            put((_DONE, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            put((_ERROR, e))

    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(pump,), daemon=True, name="zephyr-prefetch"
    )
    thread.start()
    try:
        while True:
            kind, x = q.get()
            if kind == _ITEM:
                yield x
            elif kind == _DONE:
                return
            else:
                raise x
    finally:
        stop.set()
        thread.join()
        close = getattr(it, "close", None)
        if close is not None:
            close()
