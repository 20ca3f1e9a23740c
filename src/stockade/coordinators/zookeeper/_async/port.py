"""The coordinator port on a ZooKeeper ensemble, over one kazoo session per client.

The recipe (node layout, records, the TTL bound) is sans-IO in
`stockade.coordinators.zookeeper`; the session, its leases and the bridge to
kazoo's threads are in `stockade.coordinators.zookeeper.session`. In the async
client every request is a future that kazoo's completion thread resolves on
the event loop (the loop never blocks); the sync client, generated from this
module, waits on kazoo's answer in place.

Acquire: one transaction creates the queue node, touches the scope's tick
node (its ``setData`` stat carries the transaction's zxid: the node's czxid,
the token) and sets the scope's journal record with the version read
(`stockade.coordinators.zookeeper._journal`). When that record shows the queue
empty, the same transaction journals the grant and the node is the holder;
otherwise ``getChildren`` tells whether the node is first, the waiter watches
the node just before its own, and once first it journals its grant (and the
expiry of a holder whose session ended without a release) in a transaction
that checks its node still exists. A release deletes the node, records
``released`` and journals it in one transaction. Renewal reads the node back
(it must still exist with the token as czxid); its send time moves the
client's deadline (K2), which the negotiated session timeout bounds.

Right after the session expired (the process was paused past it), kazoo
opens a new one: an acquire waits for it, up to its ``wait_ms`` (or the
request timeout ``timeout_ms`` when ``wait_ms`` is 0), and enqueues again.
"""

from __future__ import annotations

import secrets
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency

from stockade.client._shared import Grant
from stockade.clock import SystemClock
from stockade.coordinators import zookeeper as recipe
from stockade.coordinators._mint import new_cluster_id
from stockade.coordinators.registry import Capability, PortOptions
from stockade.coordinators.zookeeper import _journal as journal
from stockade.coordinators.zookeeper.session import ZkLease, ZkSession
from stockade.core import leases as core_leases
from stockade.core.clock import Clock
from stockade.core.errors import BackendUnavailable, InvalidArgument, LockTimeout, NotHolder
from stockade.core.journal import HistoryEvent
from stockade.core.leases import LeasePolicy, ScopeInfo, ScopeState
from stockade.core.limits import LIST_PAGE_MAX, validate_int, wait_deadline_ns
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.keys import FixedKeys, _dump, _parse, ephemeral_keyring
from stockade.transport.io import AsyncIO
from stockade.transport.kazoo import AsyncZkBridge

__all__ = ["AsyncZkCoordinatorPort", "open_port"]

_FLOORS_MAX = 100_000
_RETRY_PAUSE_S = 0.05
#: Compare-and-set attempts on a scope's journal record before giving up (each lost to another change).
_CAS_TRIES = 100
#: Journal records remembered (from this client's own writes) to skip a read before the next write.
_RECORDS_CACHED = 1024


def _failure(results: list[Any]) -> Exception | None:
    """The operation that failed a transaction (the others answer rolled back), or None."""
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            return result
    return None


class AsyncZkCoordinatorPort:
    """`AsyncCoordinatorPort` on ZooKeeper.

    Args:
        session: the client's one kazoo session (shared with the port that read the identity).
        timeout_ms: the deadline of one request.
        capabilities: what the registry declares for ``zookeeper://``.
        lock_delay_ms: after a holder's lease lapsed (not released), hold the next grant back this long (C5).
        owner: this port closes the session when it is closed or collected.
        clock: what the lock-delay is counted on (the host's monotonic clock; a simulated one in tests).
    """

    #: C5's one decision (`stockade.core.leases.lock_delay_end_ns`); the seam a control replaces.
    lock_delay_end_ns = staticmethod(core_leases.lock_delay_end_ns)

    def __init__(self, session: ZkSession, *, timeout_ms: int, capabilities: frozenset[Capability],
                 lock_delay_ms: int = 0, owner: bool = True, clock: Clock | None = None) -> None:
        self.capabilities = capabilities
        self.wait_rounds = 0  # one call waits: no per-request cap here
        self.lock_delay_ms = lock_delay_ms
        self.clock = clock or SystemClock()
        self.timeout_ms = timeout_ms
        self._session = session
        self._layout = session.layout
        self._bridge = AsyncZkBridge(session, timeout_ms)
        self._cluster_id: str | None = None
        self.keys: FixedKeys | None = None
        self._records: dict[str, journal.JournalRecord] = {}
        if session.identity is not None:
            self._cluster_id, self.keys = session.identity
        if owner:  # a handle dropped without close() ends its session (and kazoo's threads) with it
            weakref.finalize(self, session.close)

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    async def _call(self, result: Any) -> Any:
        return await self._bridge.call(result)

    async def open(self) -> None:
        if self._cluster_id is not None:
            return
        if self._session.identity is None:
            await self._bridge.start()
            client = self._session.client
            for path in self._layout.parents:
                await self._call(client.ensure_path_async(path))
            proposed = new_cluster_id()
            tx = client.transaction()
            tx.create(self._layout.meta + "/cluster", proposed.encode())
            tx.create(self._layout.meta + "/keyring", _dump(ephemeral_keyring(proposed)))
            await self._call(tx.commit_async())  # refused as a whole when another client wrote them first
            cluster, _ = await self._call(client.get_async(self._layout.meta + "/cluster"))
            keyring, _ = await self._call(client.get_async(self._layout.meta + "/keyring"))
            self._session.identity = (cluster.decode(), FixedKeys(_parse(keyring, Path("zookeeper:meta/keyring"))))
        self._cluster_id, self.keys = self._session.identity

    # -- acquire ----------------------------------------------------------------------------------

    async def _ensure_scope(self, scope: str) -> None:
        """The scope's container (deleted by the server when left empty), tick and last nodes."""
        client = self._session.client
        for result in (self._session.create_container_async(self._layout.queue_path(scope)),
                       client.create_async(self._layout.tick_path(scope), b""),
                       client.create_async(self._layout.last_path(scope), b""),
                       client.create_async(self._layout.hist_path(scope), journal.initial_record())):
            try:
                await self._call(result)
            except NodeExistsError:
                pass

    # -- the journal ----------------------------------------------------------------------------------

    async def _record(self, scope: str) -> journal.JournalRecord:
        """The scope's journal record, read now (created, with the scope's nodes, when missing)."""
        for _ in range(2):
            try:
                data, stat = await self._call(self._session.client.get_async(self._layout.hist_path(scope)))
                return self._remember(scope, journal.record_of(data, stat))
            except NoNodeError:
                await self._ensure_scope(scope)
        raise BackendUnavailable("zookeeper: the scope's journal record vanished twice", certain_no_effect=True)

    def _remember(self, scope: str, record: journal.JournalRecord) -> journal.JournalRecord:
        self._records.pop(scope, None)
        self._records[scope] = record
        while len(self._records) > _RECORDS_CACHED:
            del self._records[next(iter(self._records))]
        return record

    def _wrote(self, scope: str, write: journal.JournalWrite, stat: Any, open_token: int) -> None:
        """Remember what the record became; past each window of events, check the journals' global cap."""
        self._remember(scope, replace(write.after, open_token=open_token, version=stat.version))
        keep = journal.HISTORY_PER_SCOPE
        if write.after.count // keep != (write.after.count - len(write.creates)) // keep:
            self._session.trim_journals()

    async def _commit(self, tx: Any, write: journal.JournalWrite | None) -> list[Any]:
        """Commit ``tx`` with the journal's part in the same transaction (the seam the tests' control
        replaces with two transactions); the journal's results follow those of ``tx``."""
        if write is not None:
            write.add_to(tx)
        results: list[Any] = await self._call(tx.commit_async())
        return results

    # -- acquire ----------------------------------------------------------------------------------

    async def _enqueue(self, scope: str, holder: str, value: bytes, nonce: str) -> tuple[str, int, int, bool]:
        """Create this attempt's queue node: its path, the tick's new version, its czxid (the token), and
        whether it is the holder already (the queue was empty: its grant is journaled in the same transaction)."""
        client = self._session.client
        record_path = self._layout.hist_path(scope)
        for _ in range(_CAS_TRIES):
            record = self._records.get(scope) or await self._record(scope)
            granted = record.free and not self.lock_delay_ms  # a lock-delay is waited out before the grant
            if granted:
                write = journal.plan(record_path, record, [("grant", holder, journal.OWN_ZXID)],
                                     open_token=journal.OWN_ZXID, open_holder=holder, queued=0)
            else:
                write = journal.plan(record_path, record, [], open_token=record.open_token,
                                     open_holder=record.open_holder, queued=record.queued + 1)
            tx = client.transaction()
            tx.create(self._layout.node_prefix(scope), value, ephemeral=True, sequence=True)
            tx.set_data(self._layout.tick_path(scope), b"")
            try:
                results = await self._commit(tx, write)
            except BackendUnavailable:
                self._records.pop(scope, None)
                # Committed or not: look for this attempt's node before anything else.
                found = await self._find_own(scope, nonce)
                if found is None:
                    raise
                return found[0], -1, found[1], False  # the tick's version is unknown: C5 counts it as a lapse
            except BaseException:  # cancelled while the request was out: it may still be applied
                self._records.pop(scope, None)
                self._session.sweep(self._layout.queue_path(scope), nonce)
                raise
            failure = _failure(results)
            if failure is None:
                token = results[1].mzxid
                self._wrote(scope, write, results[2], token if granted else record.open_token)
                return results[0], results[1].version, token, granted
            self._records.pop(scope, None)
            if isinstance(failure, NoNodeError):
                await self._ensure_scope(scope)  # new scope, its emptied container deleted, or a trimmed event
            elif not isinstance(failure, BadVersionError):  # BadVersion: another change of the scope came first
                raise BackendUnavailable(f"zookeeper refused the enqueue: {results!r}", certain_no_effect=True)
        raise BackendUnavailable("zookeeper: the scope changed under every enqueue", certain_no_effect=True)

    async def _confirm(self, scope: str, holder: str, path: str, token: int) -> None:
        """Journal the grant of a node that found itself first, in a transaction that checks the node
        still exists; with it, the expiry of an open grant whose node went without a release."""
        client = self._session.client
        queue = path.rsplit("/", 1)[0]
        for _ in range(_CAS_TRIES):
            record = await self._record(scope)
            if record.open_token == token:
                return  # journaled by its own enqueue, whose answer was lost
            # Read after the record: every enqueue before that version is among these children.
            children = await self._call(client.get_children_async(queue))
            others = sum(recipe.sequence_of(child) is not None for child in children) - 1
            events: list[tuple[Any, str, int]] = []
            if record.open_token:  # first in the queue: the open grant's node is gone, unreleased
                events.append(("expire", record.open_holder, record.open_token))
            events.append(("grant", holder, token))
            write = journal.plan(self._layout.hist_path(scope), record, events, open_token=token,
                                 open_holder=holder, queued=others)
            tx = client.transaction()
            tx.check(path, 0)
            results = await self._commit(tx, write)
            failure = _failure(results)
            if failure is None:
                self._wrote(scope, write, results[1], token)
                return
            self._records.pop(scope, None)
            if results[0] is not True and not isinstance(results[0], RolledBackError):
                raise BackendUnavailable("the queue node is gone: the zookeeper session expired")
        raise BackendUnavailable("zookeeper: the scope changed under every grant", certain_no_effect=True)

    async def _find_own(self, scope: str, nonce: str) -> tuple[str, int] | None:
        """The node an enqueue with an unknown outcome made (by its nonce): (path, czxid), or None.

        Raises:
            BackendUnavailable: still no answer; the node, if any, is deleted in the background.
        """
        queue = self._layout.queue_path(scope)
        try:
            return await self._look_for(queue, nonce)
        except BackendUnavailable:
            self._session.sweep(queue, nonce)
            raise

    async def _look_for(self, queue: str, nonce: str) -> tuple[str, int] | None:
        client = self._session.client
        await self._call(client.sync_async(queue))
        try:
            children = await self._call(client.get_children_async(queue))
        except NoNodeError:
            return None
        for child in children:
            try:
                data, stat = await self._call(client.get_async(f"{queue}/{child}"))
            except NoNodeError:
                continue
            if recipe.nonce_of(data) == nonce:
                return f"{queue}/{child}", stat.czxid
        return None

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Queue a node; granted when no node of the scope has a lower sequence number.

        ``wait_ms=None``: no deadline; the node keeps its place while the session lives
        (a new session, after an expiry, enqueues again at the back), until granted or
        cancelled.

        When the session has just expired (a pause past it), or no server answers, the acquire
        waits for kazoo's next session and enqueues again, up to ``wait_ms`` (``timeout_ms``, one
        request's deadline, when ``wait_ms`` is 0).

        Returns:
            The grant; ``sent_ns`` is when the request that found the node first was sent.

        Raises:
            InvalidArgument: ``ttl_ms`` above the negotiated session timeout (nothing changed).
            BackendUnavailable: no session answered within that bound.
        """
        await self.open()
        recipe.check_ttl(ttl_ms, self._session.session_timeout_ms())
        started_ns = time.monotonic_ns()
        deadline_ns = wait_deadline_ns(started_ns, wait_ms)
        patience_ns = wait_deadline_ns(started_ns, self.timeout_ms if wait_ms == 0 else wait_ms)
        while True:
            try:
                return await self._attempt(scope, holder, ttl_ms, wait_ms, deadline_ns)
            except BackendUnavailable:
                if time.monotonic_ns() >= patience_ns:
                    raise
            await self._await_session(patience_ns)

    async def _await_session(self, until_ns: int) -> None:
        """Pause, then wait until kazoo is connected on a session (polled), at most until ``until_ns``."""
        await AsyncIO.sleep(_RETRY_PAUSE_S)
        client = self._session.client
        while not (client.connected and self._session.session_id is not None) and time.monotonic_ns() < until_ns:
            await AsyncIO.sleep(_RETRY_PAUSE_S)

    async def _attempt(self, scope: str, holder: str, ttl_ms: int, wait_ms: int | None, deadline_ns: int) -> Grant:
        client = self._session.client
        nonce = secrets.token_hex(8)  # a new one per attempt: a sweep of the last one's node leaves this one be
        sent_ns = time.monotonic_ns()
        path, tick_version, token, granted = await self._enqueue(
            scope, holder, recipe.holder_value(holder, ttl_ms, nonce), nonce)
        queue, name = path.rsplit("/", 1)
        mine = recipe.sequence_of(name)
        try:
            if granted:  # the queue was empty: no read needed
                return await self._grant(scope, holder, ttl_ms, path, token, tick_version, sent_ns, granted)
            while True:
                sent_ns = time.monotonic_ns()
                try:
                    children = await self._call(client.get_children_async(queue))
                except BackendUnavailable:
                    if time.monotonic_ns() >= deadline_ns:
                        raise
                    await AsyncIO.sleep(_RETRY_PAUSE_S)  # a failover: the node lives with the session
                    continue
                if name not in children:
                    raise BackendUnavailable("the queue node is gone: the zookeeper session expired")
                earlier = sorted((seq, child) for child in children
                                 if (seq := recipe.sequence_of(child)) is not None and mine is not None and seq < mine)
                if not earlier:
                    return await self._grant(scope, holder, ttl_ms, path, token, tick_version, sent_ns, granted)
                now_ns = time.monotonic_ns()
                if now_ns >= deadline_ns:
                    raise LockTimeout(scope, wait_ms or 0)
                wakeup = self._bridge.wakeup()
                try:
                    stat = await self._call(client.exists_async(f"{queue}/{earlier[-1][1]}", watch=wakeup))
                except BackendUnavailable:
                    continue
                if stat is not None:
                    session_s = self._session.session_timeout_ms() / 1000
                    await self._bridge.wait(wakeup, min((deadline_ns - now_ns) / 1e9, session_s))
        except BaseException:
            # Timed out, cancelled or failed: leave the queue.
            await self._leave(path)
            raise

    async def _leave(self, path: str) -> None:
        try:
            await self._call(self._session.client.delete_async(path))
        except NoNodeError:
            pass
        except Exception:  # noqa: BLE001 - retried in the background while the session lives
            self._session.discard(path)

    async def _grant(self, scope: str, holder: str, ttl_ms: int, path: str, token: int, tick_version: int,
                     sent_ns: int, journaled: bool) -> Grant:
        """The grant of ``token``, after the lock-delay when the previous holder may have lapsed (C5),
        journaled (unless its enqueue did) before it is returned.

        ZooKeeper keeps no clock a client could read, so the delay counts from when this
        client found itself first: never shorter than asked.
        """
        if self._cluster_id is None or self.keys is None:
            raise BackendUnavailable("zookeeper coordinator not opened", certain_no_effect=True)
        client = self._session.client
        if self.lock_delay_ms:
            try:
                last, _ = await self._call(client.get_async(self._layout.last_path(scope)))
            except NoNodeError:
                last = None
            seen_ns = self.clock.now_ns()
            end_ns = self.lock_delay_end_ns(lapsed=not recipe.released_just_before(last, tick_version),
                                            ended_ns=seen_ns, lock_delay_ms=self.lock_delay_ms)
            if end_ns > seen_ns:
                await AsyncIO.sleep((end_ns - seen_ns) / 1e9)
                sent_ns = self.clock.now_ns()
                stat = await self._call(client.exists_async(path))
                if stat is None or stat.czxid != token:
                    raise BackendUnavailable("the zookeeper session ended during the lock-delay")
        if not journaled:
            await self._confirm(scope, holder, path, token)
        sequence = path.rsplit("/", 1)[1][len(recipe.NODE_PREFIX):]
        lease_id = recipe.lease_id_of(token, sequence, scope)
        self._session.add(ZkLease(lease_id, scope, path, token, ttl_ms, tick_version, sent_ns,
                                  self._session.session_id))
        return Grant(lease_id, holder, self.keys.sign(FencingToken(self._cluster_id, scope, token)), ttl_ms, sent_ns)

    # -- renew and release ----------------------------------------------------------------------------

    async def renew(self, lease_id: str) -> None:
        lease = self._session.lease(lease_id)
        if lease is None or not lease.live:
            raise NotHolder(core_leases.lease_hint(lease_id), "lease released, lapsed, or its session expired")
        sent_ns = time.monotonic_ns()
        stat = await self._call(self._session.client.exists_async(lease.path))
        if stat is None or stat.czxid != lease.token:
            self._session.take(lease_id)
            raise NotHolder(core_leases.lease_hint(lease_id), "zookeeper node gone (released or session expired)")
        if not self._session.renewed(lease, sent_ns):
            raise NotHolder(core_leases.lease_hint(lease_id), "lease lapsed before the renewal was sent")

    async def release(self, lease_id: str) -> bool:
        """Delete the node and record ``released`` in one transaction (a lapse records ``lapsed``, C5)."""
        parsed = recipe.parse_lease_id(lease_id)
        if parsed is None:
            return False
        token, sequence, scope = parsed
        path = self._layout.node_path(scope, sequence)
        lease = self._session.take(lease_id)
        client = self._session.client
        if lease is None and self._session.ended_here(lease_id):
            return False  # lapsed here, or gone with its session (a pause past the session timeout)
        if lease is None:  # not live here: another client's (an operator's release), or gone already
            await self.open()
            stat = await self._call(client.exists_async(path))
            if stat is None or stat.czxid != token:
                return False
        elif self._session_ended(lease):
            return False  # its session expired (a pause past the session timeout): the node went with it
        tick_version = lease.tick_version if lease is not None else -1
        for _ in range(_CAS_TRIES):
            record = self._records.get(scope)
            if record is None or record.open_token != token:
                record = await self._record(scope)  # read, not remembered: is its grant the open one?
            write = None
            if record.open_token == token:  # a node that never journaled its grant leaves no event
                write = journal.plan(self._layout.hist_path(scope), record, [("release", record.open_holder, token)],
                                     open_token=0, open_holder="", queued=record.queued)
            tx = client.transaction()
            tx.delete(path)
            tx.set_data(self._layout.last_path(scope), recipe.last_value(token, "released", tick_version))
            try:
                results = await self._commit(tx, write)
            except BackendUnavailable:
                self._records.pop(scope, None)
                if lease is not None and self._session_ended(lease):
                    return False  # the session expired meanwhile: the node is gone with it
                if lease is not None:
                    self._session.reap(lease, "released")  # retried while the session lives
                raise
            if _failure(results) is None:
                if write is not None:
                    self._wrote(scope, write, results[2], 0)
                return True
            self._records.pop(scope, None)
            if isinstance(results[0], NoNodeError):
                return False  # gone already
            # BadVersion: another change of the scope came first (a waiter queued); read again
        raise BackendUnavailable("zookeeper: the scope changed under every release", certain_no_effect=True)

    def _session_ended(self, lease: Any) -> bool:
        """Whether the session that created ``lease``'s node is over (ZooKeeper deleted the node)."""
        return lease.session_id is None or self._session.session_id != lease.session_id

    # -- reads --------------------------------------------------------------------------------------------

    async def _head(self, scope: str) -> tuple[tuple[str, int, bytes], int] | None:
        """The holder's (sequence, czxid, data) and the number of waiters; None when nobody queues."""
        client = self._session.client
        queue = self._layout.queue_path(scope)
        for _ in range(3):
            try:
                children = await self._call(client.get_children_async(queue))
            except NoNodeError:
                return None
            queued = sorted((seq, child) for child in children if (seq := recipe.sequence_of(child)) is not None)
            if not queued:
                return None
            try:
                data, stat = await self._call(client.get_async(f"{queue}/{queued[0][1]}"))
            except NoNodeError:
                continue  # released meanwhile: look again
            return (queued[0][1][len(recipe.NODE_PREFIX):], stat.czxid, data), len(queued) - 1
        raise BackendUnavailable("zookeeper: the queue changed under three reads in a row")

    async def contenders(self, scope: str, *, limit: int) -> list[core_leases.Contender]:
        """The scope's queue nodes in sequence order (the order `acquire` serves them, C4), at most
        ``limit``: the first is the holder, as `inspect` shows it; each named by the holder its data records.
        A node deleted between the listing and its read (released, or its waiter gave up) is left out."""
        await self.open()
        client = self._session.client
        queue = self._layout.queue_path(scope)
        await self._call(client.sync_async(queue))  # catch up with the leader, as `inspect` does
        try:
            children = await self._call(client.get_children_async(queue))
        except NoNodeError:
            return []
        queued = sorted((seq, child) for child in children if (seq := recipe.sequence_of(child)) is not None)
        pending = [client.get_async(f"{queue}/{child}") for _, child in queued[:limit]]  # pipelined
        line: list[core_leases.Contender] = []
        for result in pending:
            try:
                data, _ = await self._call(result)
            except NoNodeError:
                continue
            line.append(core_leases.Contender(recipe.holder_of(data)[0], not line))
        return line

    async def _tick_floor(self, scope: str) -> int:
        """The last enqueue's zxid: no token of the scope was issued above it (0: never used)."""
        stat = await self._call(self._session.client.exists_async(self._layout.tick_path(scope)))
        return stat.mzxid if stat is not None and stat.version > 0 else 0

    async def inspect(self, scope: str) -> ScopeInfo:
        await self.open()
        # This session's server may trail a grant answered through another server: catch up with the leader.
        await self._call(self._session.client.sync_async(self._layout.queue_path(scope)))
        head = await self._head(scope)
        if head is None:
            return ScopeInfo(scope, ScopeState.FREE, None, None, await self._tick_floor(scope), 0, 0)
        (sequence, czxid, data), waiters = head
        holder, ttl_ms = recipe.holder_of(data)
        lease = self._session.lease(recipe.lease_id_of(czxid, sequence, scope))
        remaining_ms = ttl_ms if lease is None else max(0, (lease.deadline_ns - time.monotonic_ns()) // 1_000_000)
        if self._cluster_id is None:
            raise BackendUnavailable("zookeeper coordinator not opened", certain_no_effect=True)
        token = FencingToken(self._cluster_id, scope, czxid)
        return ScopeInfo(scope, ScopeState.HELD, holder, token, czxid, remaining_ms, waiters)

    async def scopes(self, *, after: str, limit: int) -> list[ScopeInfo]:
        await self.open()
        names = await self._call(self._session.client.get_children_async(self._layout.tick_parent))
        chosen = sorted(name for name in names if name > after)[:min(limit, LIST_PAGE_MAX)]
        return [await self.inspect(name) for name in chosen]

    async def last_issued(self, scope: str) -> int:
        """The holder's token if the scope is held (every earlier grant is lower), else the tick floor."""
        await self.open()
        head = await self._head(scope)
        return head[0][1] if head is not None else await self._tick_floor(scope)

    async def fence_floors(self) -> FenceFloors:
        await self.open()
        names = await self._call(self._session.client.get_children_async(self._layout.tick_parent))
        if len(names) >= _FLOORS_MAX:
            raise BackendUnavailable(f"more than {_FLOORS_MAX} scopes: fence floors not read in one pass")
        return FenceFloors({name: await self.last_issued(name) for name in sorted(names)})

    async def history(self, scope: str, *, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` journal events, oldest first (docs/history.md)."""
        await self.open()
        client = self._session.client
        record_path = self._layout.hist_path(scope)
        # This session's server may trail the events another client's answer confirmed: catch up with the
        # leader first, as `inspect` does (a follower the quorum did not wait for applies them later).
        await self._call(client.sync_async(record_path))
        try:
            names = await self._call(client.get_children_async(record_path))
        except NoNodeError:
            return []
        numbered = sorted((number, name) for name in names if (number := journal.event_number(name)) is not None)
        pending = [client.get_async(f"{record_path}/{name}") for _, name in numbered[-limit:]]  # pipelined
        events = []
        for result in pending:
            try:
                data, stat = await self._call(result)
            except NoNodeError:
                continue  # trimmed meanwhile
            event = journal.event_of(scope, data, stat)
            if event is not None:
                events.append(event)
        return events

    def identity(self) -> tuple[str, FixedKeys]:
        if self._cluster_id is None or self.keys is None:
            raise BackendUnavailable("zookeeper coordinator not opened", certain_no_effect=True)
        return self._cluster_id, self.keys

    async def aclose(self) -> None:
        self._session.close()


def open_port(options: PortOptions) -> AsyncZkCoordinatorPort:
    """The ``zookeeper://`` and ``zk://`` entries of `stockade.coordinators.registry`: one session; outside a
    running loop it is started here.

    Raises:
        InvalidArgument: a bad location, ``auth_token`` or ``tls_ca`` given, a bad timeout or lock delay.
        BackendUnavailable: the ensemble cannot be reached (outside a running loop).
    """
    from stockade.client._shared import TIMEOUT_MS_DEFAULT, TIMEOUT_MS_MAX

    if options.auth_token is not None or options.tls_ca is not None:
        raise InvalidArgument("url", "zookeeper:// speaks plain TCP without auth in this version")
    parsed = recipe.parse_location(options.location)
    timeout_ms = validate_int(
        "timeout_ms", TIMEOUT_MS_DEFAULT if options.timeout_ms is None else options.timeout_ms, 1, TIMEOUT_MS_MAX)
    connect_timeout_ms = validate_int(
        "connect_timeout_ms", TIMEOUT_MS_DEFAULT if options.connect_timeout_ms is None else options.connect_timeout_ms,
        1, TIMEOUT_MS_MAX)
    lock_delay_ms = LeasePolicy(lock_delay_ms=options.lock_delay_ms).lock_delay_ms  # validated before any I/O
    capabilities = options.capabilities
    session = ZkSession(parsed, connect_timeout_ms=connect_timeout_ms)
    if not AsyncIO.loop_running():  # started here, with the identity read, by blocking calls
        async def start() -> None:
            await AsyncZkCoordinatorPort(session, timeout_ms=timeout_ms, capabilities=capabilities, owner=False).open()

        try:
            AsyncIO.run_now(start)
        except BaseException:
            session.close()
            raise
    return AsyncZkCoordinatorPort(session, timeout_ms=timeout_ms, capabilities=capabilities,
                                  lock_delay_ms=lock_delay_ms)
