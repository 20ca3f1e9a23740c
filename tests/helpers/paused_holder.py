"""A holder paused past its lease, then writes (the etcd and ZooKeeper coordinator tests).

``paused_holder.py COORD_URL STORE_PATH COUNT [fencing-off]`` acquires scopes
p0..p{COUNT-1} (TTL 1 s), prints ``held``, and waits for a line on stdin (the
test SIGSTOPs it meanwhile, its leases lapse or its session expires and the
scopes go to others, then SIGCONTs it and writes that line). Then it writes
each scope with its own old token and prints ``accepted N rejected M``.
``fencing-off`` writes through the store with its fence swapped out: the
control that must let stale writes in.
"""

import sys

import stockade
from stockade.resources.store.sqlite_store import SQLiteStore
from stockade.testing.mutants import FencingOffStore

coord_url, store_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
mutant = sys.argv[4] if len(sys.argv) > 4 else ""
coord = stockade.connect(coord_url)
store = (FencingOffStore if mutant == "fencing-off" else SQLiteStore)(store_path, cluster_id=coord.cluster_id,
                                                                     keys=coord.verify_keys())


def acquire(scope: str) -> stockade.Lease:
    for _ in range(20):  # a busy host may drop a connection: the acquire's outcome is unknown, try again
        try:
            return coord.acquire(scope, ttl_ms=1000, wait_ms=10_000)
        except stockade.BackendUnavailable:
            continue
    raise SystemExit("no lease")


leases = [acquire(f"p{i}") for i in range(count)]
print("held", flush=True)
sys.stdin.readline()
accepted = rejected = 0
for lease in leases:
    try:
        store.put(lease.token.scope, "k", b"from the paused holder", token=lease.token)
        accepted += 1
    except stockade.StaleToken:
        rejected += 1
print(f"accepted {accepted} rejected {rejected}", flush=True)
