"""A writer process for tests/test_rwlock.py: a writer of a read/write lock that the test freezes.

``rw_zombie.py COORD_URL STORE_URL NAME READERS``: for each line ``acquire`` on stdin it takes the write
lock (waiting its turn), writes ``data`` with its token and prints ``held TOKEN``. Then, for each line
``write``, it writes ``data`` again with the same token, as a writer that does not know it was paused
past its lease would, and prints ``accepted`` or ``rejected``; ``done`` releases the lock (a lapsed
lease's release is refused, and ignored) and waits for the next ``acquire``. The test SIGSTOPs it
between ``held`` and its first ``write``.
"""

import contextlib
import sys

import stockade

TTL_MS = 1000
WAIT_MS = 60_000


def main(coord_url: str, store_url: str, name: str, readers: int) -> None:
    coord = stockade.connect(coord_url)
    store = stockade.open_store(store_url, cluster_id=coord.cluster_id)
    rw = stockade.ReadWriteLock(coord, store, name, readers=readers)
    while sys.stdin.readline().strip() == "acquire":
        lease = rw.acquire_write(ttl_ms=TTL_MS, wait_ms=WAIT_MS, holder="zombie")
        store.put(rw.scope, "data", f"zombie {lease.token.value}", token=lease.token)
        print(f"held {lease.token.value}", flush=True)
        while sys.stdin.readline().strip() == "write":  # paused (SIGSTOP) before the first one
            try:
                store.put(rw.scope, "data", f"zombie {lease.token.value} again", token=lease.token)
                print("accepted", flush=True)
            except stockade.StaleToken:
                print("rejected", flush=True)
        with contextlib.suppress(stockade.StockadeError):
            lease.release()
    store.close()
    coord.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
