"""Grant, then release or leave to expire, one scope in a loop on the PostgreSQL coordinator, until killed.

    python pg_history_cycler.py URL SCOPE [control]

Grants take the one-statement rule when the scope is free and the lease
engine's path after an expiry (which records the expiry and the grant in one
change); releases take the one-statement rule. With ``control`` the journal
is written the wrong way (`pg_history.defer_journal`): after each change's
commit, in a transaction of its own.
"""

from __future__ import annotations

import sys
import time

from pg_history import defer_journal

from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.leases import Granted, Queued

url, scope = sys.argv[1], sys.argv[2]
control = len(sys.argv) > 3 and sys.argv[3] == "control"
coord = PostgresCoordinator(url)
write_later = defer_journal(coord, url) if control else None
n = 0
while True:
    n += 1
    lease_id = new_lease_id()
    outcome = coord.attempt(scope, lease_id=lease_id, holder=f"c{n}", ttl_ms=100, wait_ms=0).outcome
    if isinstance(outcome, Queued):
        coord.cancel_wait(scope, lease_id)
    if isinstance(outcome, Granted) and n % 3:
        coord.release(lease_id)
    if write_later is not None:
        time.sleep(0.05)  # the window between the two commits, wide enough for a random kill to find it
        write_later()
    if n == 6:
        print("cycling", flush=True)  # the test kills it from now on
