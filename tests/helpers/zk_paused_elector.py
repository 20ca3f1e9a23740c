"""A leader paused past its ZooKeeper session, that stands again at once (tests/test_coordinator_zookeeper.py).

    python zk_paused_elector.py URL [control]

For each line ``WAIT_MS`` on stdin: it is elected, prints ``leader``, and
reads one more line (the test SIGSTOPs it meanwhile, past its session
timeout, then SIGCONTs it). It resigns (its session, and the leadership, are
gone) and at once stands again with ``wait_ms=WAIT_MS``, as an application
would, printing ``elected NEW_SESSION`` (whether kazoo's session id changed)
or ``unavailable`` (`BackendUnavailable`). ``control``: the old behaviour,
one attempt without waiting for the next session.
"""

from __future__ import annotations

import sys
import time

import stockade
from stockade.coordinators.zookeeper._sync.port import ZkCoordinatorPort

url = sys.argv[1]
if len(sys.argv) > 2 and sys.argv[2] == "control":
    def _once(self, scope, *, holder, ttl_ms, wait_ms):  # type: ignore[no-untyped-def]
        self.open()
        return self._attempt(scope, holder, ttl_ms, wait_ms, time.monotonic_ns() + wait_ms * 1_000_000)

    ZkCoordinatorPort.acquire = _once  # type: ignore[method-assign]

coord = stockade.connect(url)
session = coord._port._session
while line := sys.stdin.readline().strip():
    wait_ms = int(line)
    for _ in range(60):  # the control's one attempt may still meet the old session here: try again
        try:
            leadership = coord.elect("paused", ttl_ms=1000, wait_ms=30_000)
            break
        except stockade.BackendUnavailable:
            time.sleep(0.5)
    else:
        raise SystemExit("never elected")
    before = session.session_id
    print("leader", flush=True)
    sys.stdin.readline()  # paused here (SIGSTOP), past the session timeout
    try:
        leadership.resign()
    except stockade.BackendUnavailable:
        pass  # kazoo had not yet seen the expiry (ConnectionLoss): the leadership is gone anyway
    try:
        again = coord.elect("paused", ttl_ms=1000, wait_ms=wait_ms)
        print(f"elected {session.session_id != before}", flush=True)
        again.resign()
    except stockade.BackendUnavailable:
        print("unavailable", flush=True)
