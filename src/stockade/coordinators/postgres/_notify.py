"""Waking the waiters of a PostgreSQL coordinator: LISTEN/NOTIFY, and the server's clock per unit.

A unit that frees a scope (a release, an expiry it settled, a waiter leaving
the head of the queue) sends ``NOTIFY stockade_coord, '<scope>'`` just before
it commits; PostgreSQL delivers it after the commit, to every connection that
listens. Each coordinator object keeps one listening connection in a thread
(`Notifier`) that counts the notifications per scope; a waiter reads the
count before its attempt and sleeps until it moves (`Notifier.wait`), so a
release that commits between the attempt and the sleep still wakes it.

Lost notifications (the listening connection dropped, a failover) wake every
waiter at once: each just tries again, and the queue in the tables keeps the
FIFO order, so a spurious wake costs one round trip and never a place.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["CHANNEL", "Notifier", "ServerClock", "SCOPES_TRACKED_MAX"]

CHANNEL = "stockade_coord"
#: Scopes whose notification counts are kept; past it, the table is cleared and everyone is woken.
SCOPES_TRACKED_MAX = 10_000
LISTEN_POLL_S = 0.1  # how often the listening thread looks at its stop flag
RECONNECT_WAIT_S = 0.2


class ServerClock:
    """The coordinator's clock: the database server's ``clock_timestamp()``, read inside each unit.

    Every unit of `stockade.coordinators.postgres.PostgresRecords` reads the
    server's time as its first statement and leaves it here for the thread
    that runs the unit, so the lease engine's ``clock.now_ns()`` inside a unit
    is the server's time at the start of that unit (C3: no client clock judges
    expiry). Outside a unit (a read's ``describe`` after the unit closed) the
    last reading of this thread is used; a thread that never ran a unit asks
    the server (``query``).

    Readings are the server's, unguarded: every process judges by the same
    clock. (A floor kept per process would put a process that saw a later
    reading ahead of the server after a step back or a failover to a host
    whose clock is behind, and it would expire leases early.) The server's
    clock must be slewed, not stepped back (docs/coordinator-postgres.md).
    """

    def __init__(self, query: Any) -> None:
        self._query = query
        self._local = threading.local()

    def observe(self, server_ns: int) -> int:
        """Record a reading taken inside a unit; returns the clock's value for that unit."""
        self._local.now_ns = server_ns
        return server_ns

    def now_ns(self) -> int:
        now_ns = getattr(self._local, "now_ns", None)
        if now_ns is None:
            return self.observe(int(self._query()))
        return int(now_ns)


class Notifier:
    """Counts ``stockade_coord`` notifications per scope on one listening connection (a daemon thread).

    Args:
        connect: returns a new autocommit psycopg connection.
    """

    def __init__(self, connect: Any) -> None:
        self._connect = connect
        self._cond = threading.Condition()
        self._counts: dict[str, int] = {}
        self._everyone = 0
        self._stop = threading.Event()
        self._conn: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stockade-pg-listen", daemon=True)
        self._thread.start()

    def ready(self, timeout_s: float) -> bool:
        """Whether the first LISTEN is in place (waiters may rely on notifications from now on)."""
        return self._ready.wait(timeout_s)

    def seen(self, scope: str) -> tuple[int, int]:
        """The notification count of ``scope`` now: pass it to `wait` after the attempt."""
        with self._cond:
            return self._everyone, self._counts.get(scope, 0)

    def wait(self, scope: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """Sleep until ``scope`` was notified since ``seen`` or ``timeout_s`` passed; True if notified."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (self._everyone, self._counts.get(scope, 0)) != seen, max(0.0, timeout_s)
            )

    def wake(self, scopes: object) -> None:
        """Count a notification for each scope (also called locally when this process commits one)."""
        with self._cond:
            if len(self._counts) > SCOPES_TRACKED_MAX:
                self._counts.clear()
                self._everyone += 1
            for scope in scopes:  # type: ignore[attr-defined]
                self._counts[scope] = self._counts.get(scope, 0) + 1
            self._cond.notify_all()

    def _wake_everyone(self) -> None:
        with self._cond:
            self._everyone += 1
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
                self._conn.execute(f"LISTEN {CHANNEL}")
                self._ready.set()
                self._wake_everyone()  # anything sent while we were not listening is lost: everyone looks again
                while not self._stop.is_set():
                    scopes = [n.payload for n in self._conn.notifies(timeout=LISTEN_POLL_S)]
                    if scopes:
                        self.wake(scopes)
            except Exception:  # noqa: BLE001 - a dropped connection: wake everyone, connect again
                self._wake_everyone()
                self._stop.wait(RECONNECT_WAIT_S)
            finally:
                conn, self._conn = self._conn, None
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass

    def close(self) -> None:
        """Stop listening; the thread closes its connection within `LISTEN_POLL_S` (not waited for)."""
        self._stop.set()
