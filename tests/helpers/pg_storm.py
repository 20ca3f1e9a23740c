"""One process of the S15 storm: acquire, fenced write, release, on random scopes, through failovers.

``pg_storm.py COORD_URL STORE_URL SEED SCOPES`` prints one JSON line per event, flushed:

- ``{"grant": scope, "token": t, "at": ns, "sent": ns}`` when a grant came back (``at``: CLOCK_MONOTONIC;
  ``sent``: when the acquire began, before the server made the grant);
- ``{"write": scope, "token": t, "ok": bool, "at": ns}`` for each fenced write (``ok``: accepted);
- ``{"release": scope, "token": t, "at": ns}`` when the holder stops using the lease (just before
  it asks for the release: from then on it holds nothing);
- ``{"unavailable": 1}`` for an attempt the coordinator did not answer (a failover under way).

It runs until stdin closes. Every error but the coordinator's unavailability ends it.
"""

import json
import random
import sys
import threading
import time

import stockade
from stockade.core.errors import BackendUnavailable, LeaseLost, LockTimeout, NotHolder, StaleToken

coord_url, store_url, seed, scopes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()


def say(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


coord = None
while coord is None and not stop.is_set():
    try:
        coord = stockade.connect(coord_url)
    except BackendUnavailable:
        time.sleep(0.1)
store = stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=coord.verify_keys()) if coord else None
say(ready=1)
while not stop.is_set():
    scope = f"s{rng.randrange(scopes)}"
    sent = time.monotonic_ns()
    try:
        lease = coord.acquire(scope, ttl_ms=1_000, wait_ms=2_000, keepalive=False)
    except (BackendUnavailable, LockTimeout, LeaseLost):
        # LeaseLost: granted after a wait so long that the lease expired before the client could use it
        # (a busy host, a failover); it never became a holder, so it is not a grant here.
        say(unavailable=1)
        time.sleep(0.02)
        continue
    say(grant=scope, token=lease.token.value, at=time.monotonic_ns(), sent=sent)
    for n in range(2):
        try:
            store.put(scope, f"k{n}", str(lease.token.value), token=lease.token)
            say(write=scope, token=lease.token.value, ok=True, at=time.monotonic_ns())
        except StaleToken:
            say(write=scope, token=lease.token.value, ok=False, at=time.monotonic_ns())
    say(release=scope, token=lease.token.value, at=time.monotonic_ns())
    try:
        lease.release()
    except (BackendUnavailable, LeaseLost, NotHolder):
        pass
