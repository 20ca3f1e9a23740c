"""One kazoo session per ZooKeeper client, and the leases it holds.

`ZkSession` owns the `kazoo.client.KazooClient` (its threads, its one
session), records the session timeout each server negotiated, and keeps the
leases granted on it. A lease whose client did not renew it by its deadline
is deleted here, by a reaper thread, with its scope's ``last`` record set to
``lapsed`` and its expiry journaled in the same transaction: the node would
otherwise live as long as the session, which the client keeps alive by
itself. When the session expires, every lease on it ends at once (their
nodes are gone; the next grant of each scope journals the expiry). Past each
window of events a scope writes, a background pass keeps the journals of all
scopes under their global cap (`trim_journals`).

How the port waits for kazoo's answers, blocking or awaited, is the
transport's (`stockade.transport.kazoo`): the port is written once against the
async bridge and generated for the sync one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    NoNodeError,
)
from kazoo.protocol.serialization import Connect, Create2
from kazoo.protocol.states import KeeperState
from kazoo.security import OPEN_ACL_UNSAFE

from stockade.coordinators import zookeeper as recipe
from stockade.coordinators.zookeeper import _journal as journal
from stockade.core.errors import BackendUnavailable
from stockade.transport.kazoo import UNREACHABLE

__all__ = ["ZkSession", "ZkLease"]

#: Lease ids remembered as ended here (lapsed, or their session expired), so that their release
#: answers "not held" instead of failing while the client opens its next session.
EXPIRED_REMEMBERED = 1024
_REAP_RETRY_S = 0.1
_SWEEP_TRIES = 6000  # 10 minutes of tries, 0.1 s apart
#: kazoo's own log (reconnects, dropped connections): silent unless the application configures it.
_LOGGER = logging.getLogger("stockade.zookeeper")
_LOGGER.addHandler(logging.NullHandler())
_CONTAINER = 4  # CreateMode.CONTAINER


class _CreateContainer(Create2):
    """``createContainer`` (opcode 19): a parent the server deletes once it is left empty."""

    __slots__ = ()
    type = 19


class Client(KazooClient):
    """kazoo's client, except that a request handed to its connection thread lets a ``KeyboardInterrupt`` through.

    kazoo's hand-off (``KazooClient._call``: queue the request, write a byte to wake the connection thread)
    turns whatever that write raises into ``ConnectionClosedError``. A Ctrl-C that lands there (the signal's
    handler runs at the next bytecode of the thread that asked) came out as an unreachable server, which a
    wait until granted retries: the user's first Ctrl-C was lost, and a test saw it (the first SIGINT of a sync
    wait on ZooKeeper had not ended it 15 s later; the second did). Here only an `Exception` from the write is
    turned into ``ConnectionClosedError``; the states kazoo refuses a request in are still refused by kazoo.
    """

    def _call(self, request: Any, async_object: Any) -> Any:
        if self._state in _REFUSING:
            return super()._call(request, async_object)  # answered with kazoo's errors, nothing queued
        self._queue.append((request, async_object))
        try:
            self._connection._write_sock.send(b"\0")  # None once closed: an AttributeError, an Exception
        except Exception:  # noqa: BLE001 - as kazoo answers it; a KeyboardInterrupt goes to the caller
            async_object.set_exception(ConnectionClosedError("Connection has been closed"))
        return None


#: The states in which kazoo refuses a request without queueing it.
_REFUSING = (KeeperState.AUTH_FAILED, KeeperState.CLOSED, KeeperState.EXPIRED_SESSION)


@dataclass(slots=True)
class ZkLease:
    """A lease granted on this session: its node, token and deadline (``renewed_ns`` + ``ttl_ms``)."""

    lease_id: str
    scope: str
    path: str
    token: int
    ttl_ms: int
    tick_version: int
    renewed_ns: int
    session_id: int | None
    live: bool = field(default=True)

    @property
    def deadline_ns(self) -> int:
        return self.renewed_ns + self.ttl_ms * 1_000_000


class ZkSession:
    """The kazoo client of one coordinator handle (no I/O until started).

    Args:
        location: the parsed url.
        connect_timeout_ms: how long a start may take.
    """

    def __init__(self, location: recipe.ZkLocation, *, connect_timeout_ms: int) -> None:
        self.location = location
        self.layout = recipe.Layout(location.chroot + recipe.ROOT)
        self.connect_timeout_ms = connect_timeout_ms
        self.client = Client(
            hosts=",".join(f"{h}:{p}" for h, p in location.hosts), timeout=location.session_timeout_ms / 1000,
            logger=_LOGGER,
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 1.0},
        )
        #: The smallest session timeout any server negotiated on this session (None before the first).
        self.negotiated_ms: int | None = None
        self.identity: Any = None
        self._lock = threading.Condition()
        self._leases: dict[str, ZkLease] = {}
        self._expired: dict[str, None] = {}  # lease ids live when their session expired, in order (bounded)
        self._reaper: threading.Thread | None = None
        self._closed = False
        self._trimming = False
        self._trim_again = False
        self._session_id: int | None = None
        self.client.add_listener(self._on_state)
        self._hook_negotiation()

    def _hook_negotiation(self) -> None:
        """Record what each server negotiates (kazoo keeps only what it asked for)."""
        handler = self.client._connection
        invoke = handler._invoke

        def recording_invoke(timeout: float, request: Any, xid: Any = None) -> Any:
            answer = invoke(timeout, request, xid)
            if isinstance(request, Connect) and answer and getattr(answer[0], "time_out", 0) > 0:
                with self._lock:
                    ms = int(answer[0].time_out)
                    self.negotiated_ms = ms if self.negotiated_ms is None else min(self.negotiated_ms, ms)
            return answer

        handler._invoke = recording_invoke

    def session_timeout_ms(self) -> int:
        if self.negotiated_ms is None:
            raise BackendUnavailable("zookeeper session not established", certain_no_effect=True)
        return self.negotiated_ms

    @property
    def session_id(self) -> int | None:
        """The session's id, also while disconnected (kazoo's ``client_id`` is None then); None once
        it expired, until the next session is established."""
        session_id = self.client._session_id
        return int(session_id) if session_id else None

    # -- leases ---------------------------------------------------------------------------------

    def add(self, lease: ZkLease) -> None:
        with self._lock:
            self._leases[lease.lease_id] = lease
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, name="stockade-zk-reaper", daemon=True)
                self._reaper.start()
            self._lock.notify_all()

    def lease(self, lease_id: str) -> ZkLease | None:
        with self._lock:
            return self._leases.get(lease_id)

    def renewed(self, lease: ZkLease, sent_ns: int) -> bool:
        """Move the deadline to ``sent_ns`` + TTL; False if the lease ended meanwhile."""
        with self._lock:
            if not lease.live or sent_ns > lease.deadline_ns:
                return False
            lease.renewed_ns = max(lease.renewed_ns, sent_ns)
            return True

    def take(self, lease_id: str) -> ZkLease | None:
        """End a live lease here (its release follows); None if it is not live on this session."""
        with self._lock:
            lease = self._leases.pop(lease_id, None)
            if lease is None or not lease.live:
                return None
            lease.live = False
            return lease

    def ended_here(self, lease_id: str) -> bool:
        """Whether ``lease_id`` lapsed here (its deadline passed; its node is reaped in the background)
        or was live when its session expired (its node went with the session)."""
        with self._lock:
            return lease_id in self._expired

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:  # the session expired (or the client stopped): its nodes are gone
            with self._lock:
                for lease in self._leases.values():
                    lease.live = False
                    self._ended_here(lease.lease_id)
                self._leases.clear()

    def _ended_here(self, lease_id: str) -> None:
        # Under the lock. The oldest are forgotten first: bounded.
        self._expired[lease_id] = None
        while len(self._expired) > EXPIRED_REMEMBERED:
            del self._expired[next(iter(self._expired))]

    def _reap_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now_ns = time.monotonic_ns()
                due = [lease for lease in self._leases.values() if lease.deadline_ns <= now_ns]
                for lease in due:
                    lease.live = False
                    del self._leases[lease.lease_id]
                    self._ended_here(lease.lease_id)
                if not due:
                    next_ns = min((lease.deadline_ns for lease in self._leases.values()), default=None)
                    self._lock.wait(None if next_ns is None else max(0.001, (next_ns - now_ns) / 1e9))
                    continue
            for lease in due:
                self.reap(lease, "lapsed")

    def reap(self, lease: ZkLease, how: str) -> None:
        """Delete a lease's node, record how it ended (C5) and journal it (an expiry, or a release whose
        answer was lost) in one transaction; retried in the background while its session lives (a node
        of an expired session is gone with it)."""
        if self._closed or lease.session_id is None or self.session_id != lease.session_id:
            return
        threading.Thread(target=self._reap_run, args=(lease, how), name="stockade-zk-reap", daemon=True).start()

    def _reap_run(self, lease: ZkLease, how: str) -> None:
        record_path = self.layout.hist_path(lease.scope)
        for _ in range(_SWEEP_TRIES):
            if self._closed or self.session_id != lease.session_id:
                return
            try:
                data, stat = self.client.get(record_path)
                record = journal.record_of(data, stat)
                tx = self.client.transaction()
                tx.delete(lease.path)
                tx.set_data(self.layout.last_path(lease.scope),
                            recipe.last_value(lease.token, how, lease.tick_version))
                if record.open_token == lease.token:
                    kind: journal.EventKind = "release" if how == "released" else "expire"
                    journal.plan(record_path, record, [(kind, record.open_holder, lease.token)], open_token=0,
                                 open_holder="", queued=record.queued).add_to(tx)
                results = tx.commit()
            except NoNodeError:
                return  # no journal record: nothing of this scope to settle
            except Exception:  # noqa: BLE001 - unreachable for now: try again
                time.sleep(_REAP_RETRY_S)
                continue
            if not any(isinstance(r, BadVersionError | NoNodeError) for r in results[1:]):
                return  # done, or the node was gone already (released by an operator)
            # another change of the scope came first, or a global trim took an event: read again

    def trim_journals(self) -> None:
        """Keep the events of all scopes' journals under `journal.HISTORY_TOTAL_MAX`, in the background
        (one pass at a time): over it, the journals least recently written are emptied first."""
        with self._lock:
            if self._closed:
                return
            if self._trimming:  # a pass is running: it runs once more when it ends (it may have
                self._trim_again = True  # counted this scope's journal before its last write)
                return
            self._trimming = True
        threading.Thread(target=self._trim_passes, name="stockade-zk-trim", daemon=True).start()

    def _trim_passes(self) -> None:
        while True:
            self._trim_run()
            with self._lock:
                if not self._trim_again or self._closed:
                    self._trimming = self._trim_again = False
                    self._lock.notify_all()
                    return
                self._trim_again = False

    def _trim_run(self) -> None:
        try:
            parent = self.layout.hist_parent
            names = self.client.get_children(parent)
            if len(names) * journal.HISTORY_PER_SCOPE <= journal.HISTORY_TOTAL_MAX:
                return  # cannot be over the cap: no need to look further
            stats = [(stat.mzxid, name, stat.numChildren) for name in names
                     if (stat := self.client.exists(f"{parent}/{name}")) is not None]
            total = sum(children for _, _, children in stats)
            for _, name, _ in sorted(stats):
                if total <= journal.HISTORY_TOTAL_MAX or self._closed:
                    return
                for _ in range(3):  # lost to a writer of that scope: read again
                    data, stat = self.client.get(f"{parent}/{name}")
                    record = journal.record_of(data, stat)
                    write = journal.plan(f"{parent}/{name}", record, [], open_token=record.open_token,
                                         open_holder=record.open_holder, queued=record.queued, per_scope=0)
                    tx = self.client.transaction()
                    write.add_to(tx)
                    if not any(isinstance(r, Exception) for r in tx.commit()):
                        total -= len(write.deletes)
                        break
        except Exception:  # noqa: BLE001 - unreachable, or closed: the next window's pass tries again
            pass

    def discard(self, path: str) -> None:
        """Delete a waiter's node in the background, retried while this session lives."""
        session_id = self.session_id
        if self._closed or session_id is None:
            return

        def again() -> None:
            if self.session_id == session_id:
                self.discard(path)

        self._retried(self.client.delete_async(path), again)

    def sweep(self, queue: str, nonce: str) -> None:
        """Find and delete, in the background, the node an enqueue with an unknown outcome may have
        made (its data carries ``nonce``): retried while this session lives, else it would hold
        its place in the queue until the session ends."""
        session_id = self.session_id
        if self._closed or session_id is None:
            return

        def run() -> None:
            for _ in range(_SWEEP_TRIES):
                if self._closed or self.session_id != session_id:
                    return  # a new session: the old one's nodes are gone
                try:
                    self.client.sync(queue)
                    for child in self.client.get_children(queue):
                        try:
                            data, _ = self.client.get(f"{queue}/{child}")
                        except NoNodeError:
                            continue
                        if recipe.nonce_of(data) == nonce:
                            self.client.delete(f"{queue}/{child}")
                    return
                except NoNodeError:
                    return
                except Exception:  # noqa: BLE001 - unreachable for now: try again
                    time.sleep(_REAP_RETRY_S)

        threading.Thread(target=run, name="stockade-zk-sweep", daemon=True).start()

    def _retried(self, result: Any, again: Callable[[], None]) -> None:
        def done(finished: Any) -> None:
            try:
                finished.get_nowait()
            except UNREACHABLE[:3]:
                timer = threading.Timer(_REAP_RETRY_S, again)
                timer.daemon = True
                timer.start()
            except Exception:  # noqa: BLE001 - gone already (expired, released by an operator)
                pass

        result.rawlink(done)

    # -- requests kazoo does not offer ------------------------------------------------------------

    def create_container_async(self, path: str) -> Any:
        result = self.client.handler.async_result()
        self.client._call(_CreateContainer(path, b"", OPEN_ACL_UNSAFE, _CONTAINER), result)
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # noqa: BLE001 - closing: nothing left to tell
            pass
