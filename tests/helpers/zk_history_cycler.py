"""Grant and release one scope in a loop on ZooKeeper, until killed (tests/test_history_zookeeper.py).

    python zk_history_cycler.py URL SCOPE [control]

Every third cycle a second acquire queues behind the holder and gives up at
once (``wait_ms=0``), so the next grant goes the waiter's way: found first by
a read, its grant journaled in a transaction of its own. With ``control`` the
journal is written the wrong way: each change commits first and its journal
part (events and record) in a transaction of its own right after, so a kill -9
in between leaves the scope and its journal disagreeing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import stockade
from stockade.coordinators.zookeeper._journal import OWN_ZXID
from stockade.coordinators.zookeeper._sync.port import ZkCoordinatorPort

url, scope = sys.argv[1], sys.argv[2]


def _own_zxid_named(value: bytes, zxid: int) -> bytes:
    """The journal's value with "this transaction's zxid" spelled out: the change's, in another transaction."""
    shown = json.loads(value)
    if isinstance(shown, list) and shown[2] == OWN_ZXID:
        shown[2] = zxid
    elif isinstance(shown, dict) and shown["open"] and shown["open"][0] == OWN_ZXID:
        shown["open"][0] = zxid
    return json.dumps(shown).encode()


if len(sys.argv) > 3 and sys.argv[3] == "control":
    def _apart(self, tx, write):  # type: ignore[no-untyped-def]
        results = self._call(tx.commit_async())
        if write is None or any(isinstance(result, Exception) for result in results):
            return results
        zxid = getattr(results[-1], "mzxid", 0)  # an enqueue's: the tick's stat (its last operation)
        write = dataclasses.replace(
            write, record_value=_own_zxid_named(write.record_value, zxid),
            creates=tuple((path, _own_zxid_named(value, zxid)) for path, value in write.creates))
        time.sleep(0.05)  # the window between the two transactions, wide enough for a random kill to find it
        journal_tx = self._session.client.transaction()
        write.add_to(journal_tx)
        return results + self._call(journal_tx.commit_async())

    ZkCoordinatorPort._commit = _apart  # type: ignore[method-assign]

# A 1 s session on a loaded host can miss its first connect (ConnectionLoss): that is not what the test is
# about (the journal under kill -9), so the start is tried up to 5 times before the cycler gives up.
for attempt in range(5):
    try:
        coord = stockade.connect(url)
        break
    except stockade.BackendUnavailable:
        if attempt == 4:
            raise
# The same for a cycle: at a load of 9 the 1 s session lost its connection in a release before the sixth
# cycle (the ensemble answers every worker of the run). What is written stays for the test's check; the cycle
# is tried again, and 20 such failures end the cycler.
unreachable = cycled = 0
n = 0
while True:
    n += 1
    try:
        lease = coord.acquire(scope, ttl_ms=1000, wait_ms=5000, holder=f"c{n}")
    except stockade.LeaseLost:  # a grant back after its 1 s (load 26, twice): nothing held, the next cycle
        continue
    except stockade.BackendUnavailable:
        unreachable += 1
        if unreachable == 20:
            raise
        continue
    if n % 3 == 0:
        try:
            coord.acquire(scope, ttl_ms=1000, wait_ms=0, holder=f"w{n}")
        except (stockade.LockTimeout, stockade.LeaseLost, stockade.BackendUnavailable):
            pass
    try:
        lease.release()
    except stockade.BackendUnavailable:  # the lease ends by its TTL
        unreachable += 1
        if unreachable == 20:
            raise
        continue
    cycled += 1
    if cycled == 6:
        print("cycling", flush=True)  # the test kills it from now on
