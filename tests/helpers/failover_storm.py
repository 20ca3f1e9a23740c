"""One process of the acquire storm through leader changes: S13 on etcd, S14 on ZooKeeper.

``failover_storm.py COORD_URL STORE_URL SEED [local-counter|sequence]`` acquires random
scopes of 8 in a loop, writes to the shared fenced store with the grant's
token, and prints one line per event, flushed, with the host's monotonic clock
(shared by every process of the host)::

    grant SCOPE TOKEN T_NS          a lease was granted
    write SCOPE TOKEN ok|stale T_NS the fenced write's outcome
    release SCOPE TOKEN T_NS        the lease was given back
    error KIND T_NS                 the coordinator could not be reached (a failover)

The controls, which the checks must catch: ``local-counter`` takes tokens
from a per-process counter instead of etcd's create revision; ``sequence``
takes ZooKeeper's queue node sequence suffix (plus one) instead of its czxid,
which restarts when the scope's emptied container is deleted.
"""

import random
import sys
import time
from typing import Any

import stockade

coord_url, store_url, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
mutant = sys.argv[4] if len(sys.argv) > 4 else ""


def _open() -> tuple[Any, Any]:
    """The coordinator and the store; a busy host's ensemble may answer the first tries late (3 more)."""
    for attempt in range(4):
        try:
            coord = stockade.connect(coord_url)
            keys = "unsigned" if mutant else coord.verify_keys()
            return coord, stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=keys)
        except stockade.BackendUnavailable:
            if attempt == 3:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


coord, store = _open()
rng = random.Random(seed)
counter = 0


def say(*fields: object) -> None:
    sys.stdout.write(" ".join(map(str, fields)) + f" {time.monotonic_ns()}\n")
    sys.stdout.flush()


say("ready")
while True:
    scope = f"s{rng.randrange(8)}"
    try:
        lease = coord.acquire(scope, ttl_ms=3_000, wait_ms=30_000)
    except stockade.StockadeError as exc:  # a failover (unreachable, timed out, a lease lost while granted)
        say("error", type(exc).__name__)
        time.sleep(0.05)
        continue
    counter += 1
    if mutant == "local-counter":
        token = counter
    elif mutant == "sequence":
        token = int(lease.lease_id.split(".")[1]) + 1
    else:
        token = lease.token.value
    say("grant", scope, token)
    try:
        if mutant:
            store.put(scope, "k", str(token).encode(), token=stockade.FencingToken(coord.cluster_id, scope, token))
        else:
            store.put(scope, "k", str(token).encode(), token=lease.token)
        say("write", scope, token, "ok")
    except stockade.StaleToken:
        say("write", scope, token, "stale")
    except stockade.StockadeError as exc:
        say("write", scope, token, type(exc).__name__)
    say("release", scope, token)
    try:
        lease.release()
    except stockade.StockadeError:
        pass
