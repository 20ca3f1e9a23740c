"""Work started at once from several threads, each failure counted by its message (the isolation tests).

A database whose default isolation is REPEATABLE READ or SERIALIZABLE fails a component's units only
when they overlap: a unit's snapshot then predates what the unit before it committed. Each thread
here starts behind one barrier, so that their first statements (an install, a connection's first
unit) meet.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable


def errors_at_once(threads: int, work: Callable[[int], None]) -> collections.Counter[str]:
    """Run ``work(index)`` in ``threads`` threads started together; each exception's type and message
    (first 160 characters) with its count. ``work`` counts its own failures where it goes on after one."""
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def run(index: int) -> None:
        barrier.wait()
        try:
            work(index)
        except Exception as exc:  # noqa: BLE001 - counted: the test says which
            with lock:
                errors[f"{type(exc).__name__}: {exc}"[:160]] += 1

    started = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return errors
