"""One of N processes contending on one scope through one coordinator file.

Uses the coordinator's non-blocking primitive directly so that it can record
when it joined the queue (needed to judge FIFO order). Prints one JSON line
per attempt, and at the end ``{"busy": N}``: the calls asked again because the
file stayed locked past the busy timeout with nothing done.
"""

import json
import random
import sys
import time

from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.core import leases as core_leases
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted, LeasePolicy, Queued, TimedOut

path, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
mutant = sys.argv[4] if len(sys.argv) > 4 else ""
rng = random.Random(seed)
# What is judged is order (tokens, overlaps, FIFO), not the speed of a loaded host: a process the host stalls for
# seconds is not presumed dead (its waiter stays queued), its lease does not lapse, and its wait does not time
# out. With a 2 s TTL and stale time and a 10 s wait, one wait of 4 processes timed out beside 4 busy loops (load 18).
TTL_MS, WAIT_S = 30_000, 60
GRANTS_MIN = 30  # and each process contends until it was granted this often (55 grants in all at load 60 once)
POLICY = LeasePolicy(waiter_stale_ms=60_000)


def barging_acquire(record, request, now_ns, policy):
    # control: whoever asks while the scope is free takes it, ahead of the queue
    mine = tuple(w for w in record.waiters if w.lease_id == request.lease_id)
    others = tuple(w for w in record.waiters if w.lease_id != request.lease_id)
    new, outcome = core_leases.acquire(core_leases.replace(record, waiters=mine), request, now_ns, policy)
    return core_leases.replace(new, waiters=new.waiters + others), outcome


def overlapping_acquire(record, request, now_ns, policy):
    # control: grants while another lease is still held
    if record.lease is not None and record.lease.lease_id != request.lease_id:
        record = core_leases.replace(record, lease=None)
    return core_leases.acquire(record, request, now_ns, policy)


engine = SQLiteCoordinator(path, policy=POLICY)
if mutant == "barging":
    engine.acquire_rule = barging_acquire
elif mutant == "overlapping":
    engine.acquire_rule = overlapping_acquire
def patiently(call, *args):
    """``call(*args)``, asked again while the file stayed locked past the busy timeout with nothing done (a loaded
    host: several processes fsync on 2 busy cores); counted in ``busy``."""
    while True:
        try:
            return call(*args)
        except BackendUnavailable as exc:
            if not exc.certain_no_effect:
                raise
            busy[0] += 1


def attempt(lease_id, deadline_ns):
    return engine.try_acquire("contended", lease_id=lease_id, holder=f"p{seed}", ttl_ms=TTL_MS,
                              wait_deadline_ns=deadline_ns)


busy = [0]
end = time.monotonic() + seconds
grants = 0
while time.monotonic() < end or grants < GRANTS_MIN:
    lease_id = new_lease_id()
    deadline_ns = time.monotonic_ns() + WAIT_S * 1_000_000_000
    while True:  # joining the queue: an attempt that did nothing is no join, so it starts again
        enq0 = time.monotonic_ns()
        try:
            outcome = attempt(lease_id, deadline_ns)
            break
        except BackendUnavailable as exc:
            if not exc.certain_no_effect:
                raise
            busy[0] += 1
    enq1 = time.monotonic_ns()
    while isinstance(outcome, Queued):
        time.sleep(0.001)
        outcome = patiently(attempt, lease_id, deadline_ns)
    if isinstance(outcome, TimedOut):
        print(json.dumps({"enq0": enq0, "enq1": enq1, "timed_out": True}), flush=True)
        continue
    assert isinstance(outcome, Granted)
    grants += 1
    time.sleep(rng.random() * 0.002)  # hold briefly
    released = patiently(engine.release, lease_id).at_ns
    print(json.dumps({"enq0": enq0, "enq1": enq1, "granted": outcome.lease.granted_ns, "released": released,
                      "token": outcome.lease.token.value, "pid": seed}), flush=True)
    time.sleep(rng.random() * 0.002)
print(json.dumps({"busy": busy[0]}), flush=True)
