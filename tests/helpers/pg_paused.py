"""A client that the S-paused test stops with SIGSTOP while it holds a lease.

``pg_paused.py COORD_URL STORE_PATH ROUNDS CONTROL``: each round it acquires
scope ``p`` (TTL 300 ms, keepalive on), prints ``held TOKEN``, waits for a line
on stdin (the test stopped and continued it meanwhile), then writes under its
token and prints ``accepted`` or ``rejected``. ``CONTROL=1`` writes to a store
with fencing off (`stockade.testing.mutants.FencingOffStore`), which must accept.
"""

import sys

import stockade
from stockade.core.errors import LeaseLost, NotHolder, StaleToken
from stockade.testing.mutants import FencingOffStore

coord_url, store_path, rounds, control = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
coord = stockade.connect(coord_url)
store = FencingOffStore(store_path, cluster_id=coord.cluster_id, keys=coord.verify_keys()) if control else \
    stockade.open_store(f"sqlite:///{store_path}", cluster_id=coord.cluster_id, keys=coord.verify_keys())


def hold() -> stockade.Lease:
    for _ in range(20):  # on a busy machine a 300 ms lease can lapse before its first renewal: take another
        try:
            return coord.acquire("p", ttl_ms=300, wait_ms=10_000)
        except LeaseLost:
            continue
    raise SystemExit("pg_paused: 20 leases in a row lapsed before their first renewal")


for _ in range(rounds):
    lease = hold()
    print(f"held {lease.token.value}", flush=True)
    sys.stdin.readline()
    try:
        store.put("p", "k", b"paused", token=lease.token)
        print("accepted", flush=True)
    except StaleToken:
        print("rejected", flush=True)
    try:
        lease.release()
    except (LeaseLost, NotHolder):
        pass
