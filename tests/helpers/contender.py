"""One of N processes contending on one scope through one coordinator file.

Uses the coordinator's non-blocking primitive directly so that it can record
when it joined the queue (needed to judge FIFO order). Prints one JSON line
per attempt.
"""

import json
import random
import sys
import time

from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.core.leases import Granted, Queued, TimedOut

path, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
engine = SQLiteCoordinator(path)
end = time.monotonic() + seconds
while time.monotonic() < end:
    lease_id = new_lease_id()
    deadline_ns = time.monotonic_ns() + 10_000_000_000
    enq0 = time.monotonic_ns()
    outcome = engine.try_acquire("contended", lease_id=lease_id, holder=f"p{seed}", ttl_ms=2000,
                                 wait_deadline_ns=deadline_ns)
    enq1 = time.monotonic_ns()
    while isinstance(outcome, Queued):
        time.sleep(0.001)
        outcome = engine.try_acquire("contended", lease_id=lease_id, holder=f"p{seed}", ttl_ms=2000,
                                     wait_deadline_ns=deadline_ns)
    if isinstance(outcome, TimedOut):
        print(json.dumps({"enq0": enq0, "enq1": enq1, "timed_out": True}), flush=True)
        continue
    assert isinstance(outcome, Granted)
    time.sleep(rng.random() * 0.002)  # hold briefly
    released = engine.release(lease_id).at_ns
    print(json.dumps({"enq0": enq0, "enq1": enq1, "granted": outcome.lease.granted_ns, "released": released,
                      "token": outcome.lease.token.value, "pid": seed}), flush=True)
    time.sleep(rng.random() * 0.002)
