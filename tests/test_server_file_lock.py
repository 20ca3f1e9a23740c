"""The server's event loop never waits on a file lock (issue 8, finding 6, the server's half).

Another process holding the store's write lock (a paused writer, a backup)
used to freeze the loop for the store's busy timeout: a lone write was
committed on the loop, which then waited in ``BEGIN IMMEDIATE``, and every
other request (an unrelated holder's renewal among them) waited with it. Now
the loop commits only if the lock is free at that moment and otherwise hands
the write to the writer thread. Judged by order, not by time: does the loop
run other work while the write is still waiting for the lock?
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from helpers.server_fixtures import request

from stockade.core.errors import BackendUnavailable
from stockade.core.tokens import FencingToken
from stockade.resources.store.sqlite_store import BatchWrite, SQLiteStore
from stockade.server._groupcommit import GroupCommitter

CLUSTER = "0123456789abcdef"


def _order_while_locked(path: Path, *, never_wait: bool) -> tuple[list[str], object]:
    """Hold the store's write lock elsewhere, submit a write, and record what the loop did first."""
    store = SQLiteStore(path, cluster_id=CLUSTER, busy_timeout_ms=1_000, keys="unsigned")
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another "process" holds the write lock

    async def main() -> tuple[list[str], object]:
        loop = asyncio.get_running_loop()
        committer: GroupCommitter[BatchWrite] = GroupCommitter(
            "store", store.apply_batch, loop, try_batch=store.try_apply_batch if never_wait else None
        )
        committer.start()
        order: list[str] = []
        write = committer.submit(BatchWrite("put", "a", "k", b"v", FencingToken(CLUSTER, "a", 1)))
        write.add_done_callback(lambda _: order.append("write answered"))
        for i in range(5):  # other requests the loop should serve meanwhile
            await asyncio.sleep(0)
            order.append(f"other request {i}")
        order.append("lock released")
        holder.execute("ROLLBACK")  # the other process lets go
        try:
            outcome: object = await write
        except Exception as exc:  # noqa: BLE001 - the control's outcome is inspected
            outcome = exc
        committer.stop()
        return order, outcome

    try:
        return asyncio.run(main())
    finally:
        holder.close()
        store.close()


def test_the_loop_serves_others_while_a_write_waits_for_the_store_lock(tmp_path):
    order, outcome = _order_while_locked(tmp_path / "store.db", never_wait=True)
    assert order[:6] == [f"other request {i}" for i in range(5)] + ["lock released"]  # served meanwhile
    assert order[-1] == "write answered"
    assert outcome.token_value == 1  # and the write committed once the lock was free


def test_control_a_loop_that_commits_inline_waits_on_the_lock(tmp_path):
    order, outcome = _order_while_locked(tmp_path / "store.db", never_wait=False)
    # The loop itself sat in BEGIN IMMEDIATE for the whole busy timeout, with nothing else served, and
    # the write failed there, before the lock was ever released.
    assert isinstance(outcome, BackendUnavailable)
    assert order.index("write answered") < order.index("lock released")


@pytest.fixture
def server(serve):
    return serve()


def test_serve_keeps_granting_while_another_process_holds_the_store(server, capsys):
    holder = sqlite3.connect(str(server.data_dir / "store.db"), isolation_level=None)
    grant = request(server.url, "POST", "/v1/locks/held/acquire", json_body={"ttl_ms": 30_000, "wait_ms": 0})
    token = __import__("json").loads(grant[2])["token"]
    holder.execute("BEGIN IMMEDIATE")
    answers: list[int] = []
    put = threading.Thread(target=lambda: answers.append(request(
        server.url, "PUT", "/v1/kv/held/k", body=b"v",
        headers={"Fencing-Token": token, "Content-Type": "application/octet-stream"})[0]))
    put.start()
    cycles = 0
    try:
        for i in range(20):  # unrelated holders, while the store is locked and the PUT waits
            status, _, body = request(server.url, "POST", f"/v1/locks/other-{i}/acquire",
                                      json_body={"ttl_ms": 10_000, "wait_ms": 0})
            assert status == 200
            lease_id = __import__("json").loads(body)["lease_id"]
            assert request(server.url, "DELETE", f"/v1/leases/{lease_id}")[0] == 204
            cycles += 1
        assert not answers, "the PUT was answered while the store's lock was still held"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        put.join(30)
    with capsys.disabled():
        print(f"\n[figure] store write lock held by another process: lock cycles completed {cycles} of 20 "
              f"meanwhile; the waiting PUT then answered {answers}")
    assert answers == [200]


_PAUSED_HOLDER = """
import sys
from stockade.resources.store import SQLiteStore
path, token = sys.argv[1], sys.argv[2]
with SQLiteStore(path, keys=path.replace("store.db", "coord.keys")) as store:  # serve's keyring beside
    with store.transaction("held", token=token) as tx:
        tx.put("step-1", b"before the pause")
        print("in-transaction", flush=True)
        sys.stdin.readline()  # the test freezes this process here
        tx.put("step-2", b"after the pause")
print("committed", flush=True)
"""


def test_a_holder_paused_in_a_transaction_on_the_servers_store_costs_no_one_a_lease(serve, capsys):
    """Finding 6 end to end: an embedded holder of the server's store, frozen inside a transaction."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import stockade

    pause_s = 30.0 if os.environ.get("STOCKADE_LONG") else 3.0
    server = serve()
    coord = stockade.connect(server.url)
    store = stockade.open_store(server.url)
    honest = coord.acquire("honest", ttl_ms=1_000)  # renewed by its keepalive every ~1/3 TTL
    held = json.loads(request(server.url, "POST", "/v1/locks/held/acquire",
                              json_body={"ttl_ms": 120_000, "wait_ms": 0})[2])["token"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", _PAUSED_HOLDER, str(server.data_dir / "store.db"), held],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    ok = failed = 0
    try:
        assert holder.stdout.readline().strip() == "in-transaction"
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        while time.monotonic() - started < pause_s:
            lease = coord.acquire(f"other-{ok % 8}", ttl_ms=5_000, wait_ms=5_000)
            try:
                store.put(lease.scope, "k", b"v", token=lease.token)
                ok += 1
            except stockade.StockadeError:
                failed += 1
            finally:
                lease.release()
        lost = honest.lost
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "committed"
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
        holder.wait(60)
        honest.release()
        coord.close()
        store.close()
    with capsys.disabled():
        print(f"\n[figure] embedded holder SIGSTOPped {pause_s:.0f} s inside a transaction on the server's store: "
              f"lock-and-write cycles on other scopes failed {failed} of {ok + failed}; honest lease lost: {lost}")
    assert failed == 0 and ok > 0 and not lost
