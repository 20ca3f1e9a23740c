"""A full disk under the embedded coordinator and store, and under `stockade serve`.

Each test puts the files on a small tmpfs and fills it to the last byte:

- embedded: an acquire, a release and a fenced write each fail as
  `BackendUnavailable`; the store's mark and data stay as they were; both
  files pass SQLite's integrity check; with room again, the lease whose
  release failed has ended with its TTL and the scope goes on above its token;
- `stockade serve`: a grant it cannot make durable is refused, and the server
  stops with exit status 74 (a restart reloads coord.db). Its grants are
  appended to its record log, which is preallocated: the first to fail is the
  one whose batch comes when a fold of the log into coord.db is due, and the
  fold finds no room. Started again with
  room, the lease it held is held a full TTL from the restart (C3) and its
  scope goes on above its token (C1).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys

import pytest
from conftest import HELPERS
from helpers import full_disk

import stockade
from stockade.core.errors import BackendUnavailable

sys.path.insert(0, str(HELPERS))
from server_fixtures import start_server  # noqa: E402

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

#: Fenced writes of 2 KB tried on the full disk (each needs a new page sooner or later).
PUTS_MAX = 200
#: Acquires of new scopes tried on the full disk.
ACQUIRES_MAX = 200
#: The exit status of a server whose coordinator commit failed (EX_IOERR).
EXIT_COMMIT_FAILED = 74


def _first_refusal(calls) -> BackendUnavailable:  # type: ignore[no-untyped-def]
    for call in calls:
        try:
            call()
        except BackendUnavailable as exc:
            return exc
    raise AssertionError("every call fit on a full disk")


def test_the_embedded_coordinator_and_store_on_a_full_disk() -> None:
    with full_disk.small_tmpfs("2m") as mount:
        coord = stockade.connect(f"sqlite:///{mount}/coord.db?process=embedded")
        store = stockade.open_store(f"sqlite:///{mount}/store.db", cluster_id=coord.cluster_id)
        try:
            lease = coord.acquire("jobs", ttl_ms=1_000, keepalive=False)
            store.put("jobs", "k", b"v1", token=lease.token)
            full_disk.fill(mount / "filler")

            _first_refusal(lambda i=i: coord.acquire(f"new-{i}", ttl_ms=1_000, wait_ms=0, keepalive=False)
                           for i in range(ACQUIRES_MAX))
            _first_refusal(lambda i=i: store.put("jobs", f"k{i}", b"x" * 2_000, token=lease.token)
                           for i in range(PUTS_MAX))
            with pytest.raises(BackendUnavailable):
                lease.release()
            assert store.high_water("jobs") == lease.token.value and store.get("jobs", "k").value == b"v1"

            (mount / "filler").unlink()
            again = coord.acquire("jobs", ttl_ms=10_000, wait_ms=30_000, keepalive=False)  # once its TTL ran out
            assert again.token.value > lease.token.value
            store.put("jobs", "k", b"v2", token=again.token)
            again.release()
        finally:
            store.close()
            coord.close()
        for name in ("coord.db", "store.db"):
            with contextlib.closing(sqlite3.connect(mount / name)) as db:
                assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_serve_on_a_full_disk_refuses_the_grant_stops_and_restarts_with_its_leases() -> None:
    with full_disk.small_tmpfs("8m") as mount:  # the record log takes 4 MiB at the start
        # Folded every 20 changes (not 4,096): the grants on the full disk go to the preallocated log until the
        # next fold, which needs room in coord.db.
        server = start_server(mount / "data", control="folds-every-20")
        try:
            coord = stockade.connect(server.url)
            held = coord.acquire("held", ttl_ms=3_000, keepalive=False)
            full_disk.fill(mount / "filler")
            refused = _first_refusal(lambda i=i: coord.acquire(f"new-{i}", ttl_ms=3_000, wait_ms=0, keepalive=False)
                                     for i in range(ACQUIRES_MAX))
            assert "HTTP 503" in str(refused), str(refused)  # the answer went out before the server stopped
            coord.close()
            assert server.proc.wait(30) == EXIT_COMMIT_FAILED, server.logs()[-2000:]
            assert "stopping so that a restart reloads coord.db" in server.logs()
        finally:
            server.stop()

        (mount / "filler").unlink()
        restarted = start_server(mount / "data")
        try:
            coord = stockade.connect(restarted.url)
            assert coord.inspect("held").holder is not None  # held a full TTL from the restart (C3)
            again = coord.acquire("held", ttl_ms=3_000, wait_ms=30_000, keepalive=False)
            assert again.token.value > held.token.value  # C1 across the stop
            again.release()
            coord.close()
        finally:
            restarted.stop()
