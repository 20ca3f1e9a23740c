"""Grant, then release or leave to expire, one scope in a loop through a coordinator file, until killed.

    python jobs_history_cycler.py COORD_PATH SCOPE [control]

With ``control`` the journal is written the wrong way: each change commits
first and its events go in a transaction of their own afterwards, so a kill -9
in between leaves a change without its event.
"""

from __future__ import annotations

import sys
import time

from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.coordinators.sqlite import _journal as _sqlite_journal
from stockade.coordinators.sqlite import _rows as _sqlite_rows

path, scope = sys.argv[1], sys.argv[2]
control = len(sys.argv) > 3 and sys.argv[3] == "control"
coord = SQLiteCoordinator(path)
if control:
    later = []
    _sqlite_rows.journal_change = lambda conn, old, new: later.append((old, new))  # type: ignore[assignment]
n = 0
while True:
    n += 1
    lease_id = new_lease_id()
    coord.try_acquire(scope, lease_id=lease_id, holder=f"c{n}", ttl_ms=100, wait_deadline_ns=0)
    if n % 3:
        coord.release(lease_id)
    if control:
        time.sleep(0.05)  # the window between the two commits, wide enough for a random kill to find it
        with coord.records.write() as tx:  # the events, in a commit of their own
            for old, new in later:
                _sqlite_journal.journal_change(tx._conn, old, new)
            later.clear()
    if n == 6:
        print("cycling", flush=True)  # the test kills it from now on
