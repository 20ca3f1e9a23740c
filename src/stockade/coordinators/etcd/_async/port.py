"""The coordinator port on an etcd cluster, over etcd's JSON gateway (``/v3/...``).

The recipe (key layout, bodies, the TTL mapping) is sans-IO in
`stockade.coordinators.etcd`; this module sends it. Each member is an
`AsyncHTTPClient` (keep-alive connections, deadlines); a request that finds a
member down, or an election under way (etcd's Unavailable, DeadlineExceeded
or "leader changed"), is sent to the next member until its deadline. Every
request of the recipe may be sent twice: a queue key is named after its etcd
lease, and both transactions compare before they write.

Waiting is a watch on the predecessor's key (a streamed ``/v3/watch``): one
waiter wakes per release, in create-revision order (C4). While it waits, the
waiter keeps its own etcd lease alive, or its place would lapse.

The token is the holder key's create revision; the header revision of every
key read or write is remembered, and one that goes back (a snapshot restore behind this
process's back) is refused with `BackendUnavailable` (docs/coordinator-etcd.md). A
process that never saw the lost revisions tells a restore by etcd's status before each
acquire (`stockade.coordinators.etcd.restored_reason`), and refuses to grant until
``stockade etcd bump-revision`` has advanced the revision and recorded the new cluster.

Each grant's and release's Txn journals its events (docs/history.md): the
port remembers each scope's history head (`AsyncEtcdJournal`) and compares it
in the Txn; a head that moved fails the Txn, and it is sent again with the
head read back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from stockade.client._shared import Grant
from stockade.clock import SystemClock
from stockade.coordinators import etcd as recipe
from stockade.coordinators._mint import new_cluster_id
from stockade.coordinators.etcd._async.journal import AsyncEtcdJournal, head_in, now_ms
from stockade.coordinators.etcd._async.watch import wait_deleted
from stockade.coordinators.etcd._journal import Head, released_before, settled
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.registry import Capability
from stockade.core import leases as core_leases
from stockade.core.clock import Clock
from stockade.core.errors import BackendUnavailable, InvalidArgument, LockTimeout, NotHolder, invariant
from stockade.core.leases import ScopeInfo, ScopeState
from stockade.core.limits import LIST_PAGE_MAX, validate_scope, wait_deadline_ns
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.keys import FixedKeys, _dump, _parse, ephemeral_keyring
from stockade.transport._async.http_client import AsyncHTTPClient
from stockade.transport.http11 import HTTPEndpoint
from stockade.transport.io import AsyncIO

__all__ = ["AsyncEtcdCoordinatorPort"]

#: gRPC codes worth sending to another member: Unknown ("leader changed"), DeadlineExceeded, Internal, Unavailable.
_RETRY_CODES = frozenset({2, 4, 13, 14})
_NOT_FOUND = 5
_RETRY_PAUSE_S = 0.05
#: One member's share of a request's deadline, at least this: a paused member (SIGSTOP, a long GC)
#: must not eat the whole deadline, and an election (1 s by default) must fit in one attempt.
_ATTEMPT_MS_MIN = 1_200
_FLOORS_MAX = 100_000
#: Released etcd leases kept to grant again, per port.
_SPARES_MAX = 8
_PRUNE_AT_MIN = 1024  # grants recorded before the first sweep of lapsed ones
#: An acquire reads etcd's status (`restored`) when the last check that passed is this old: a
#: restore stops every member, rebuilds their data and elects a leader, which takes longer.
_RESTORE_CHECK_NS = 1_000_000_000
#: Txns one change tries while the history head it compares keeps moving under it.
_HEAD_TRIES = 8


#: What etcd answers every write with once its database reached ``--quota-backend-bytes`` (the NOSPACE alarm).
_SPACE_EXCEEDED = "database space exceeded"


class _EtcdRefused(BackendUnavailable):
    """etcd refused a request (its gRPC ``code``): a backend fault where the recipe does not expect it."""

    def __init__(self, code: int, message: str) -> None:
        hint = ("; etcd takes no writes until an operator frees space, compacts, defragments and disarms its "
                "NOSPACE alarm (docs/coordinator-etcd.md, \"When etcd is out of space\")"
                if _SPACE_EXCEEDED in message else "")
        super().__init__(f"etcd refused: {message}{hint}")
        self.grpc_code = code


class AsyncEtcdCoordinatorPort:
    """`AsyncCoordinatorPort` on etcd.

    Args:
        members: the cluster's client endpoints (`stockade.coordinators.etcd.parse_location`).
        layout: where this stockade cluster's keys live.
        timeout_ms: the deadline of one request, retries on other members included.
        connect_timeout_ms: the deadline of one connect.
        capabilities: what the registry declares for ``etcd://``.
        identity: the cluster id and keyring, when already read (the sync open); else `open` reads them.
        lock_delay_ms: after a holder's lease lapsed (not released), hold the next grant back this long (C5).
        clock: what the lock-delay is counted on (the host's monotonic clock; a simulated one in tests).
    """

    #: C5's one decision (`stockade.core.leases.lock_delay_end_ns`); the seam a control replaces.
    lock_delay_end_ns = staticmethod(core_leases.lock_delay_end_ns)

    def __init__(
        self,
        members: tuple[recipe.EtcdMember, ...],
        layout: recipe.Layout,
        *,
        timeout_ms: int,
        connect_timeout_ms: int,
        capabilities: frozenset[Capability],
        identity: tuple[str, FixedKeys] | None = None,
        lock_delay_ms: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.capabilities = capabilities
        self.wait_rounds = 0  # one call waits: no per-request cap here
        self.lock_delay_ms = lock_delay_ms
        self.clock = clock or SystemClock()
        self.timeout_ms = timeout_ms
        self._members = members
        self._layout = layout
        self._clients = [AsyncHTTPClient(_endpoint(m, timeout_ms, connect_timeout_ms)) for m in members]
        self._preferred = 0
        self._revision_seen = 0
        # The leases this port granted and has not released (lease -> lease id), when each was
        # last renewed (send time), their TTLs; and released ones kept to grant again.
        self._granted: dict[int, str] = {}
        self._renewed: dict[int, int] = {}
        self._key_checked: dict[int, int] = {}  # lease -> when renewal last read its holder key
        self._ttl_ms: dict[int, int] = {}
        self._prune_at = _PRUNE_AT_MIN  # forget lapsed grants when this many are recorded (`_forget_lapsed`)
        self._spares: list[tuple[int, int, int]] = []
        self._pooled: set[int] = set()
        self._cluster_id: str | None = None
        self._marker: recipe.Incarnation | None = None
        self._checked_ns: int | None = None
        self.journal = AsyncEtcdJournal(self, layout)  # the history heads it journals after (docs/history.md)
        self.keys: FixedKeys | None = None
        if identity is not None:
            self._cluster_id, self.keys = identity

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    # -- requests -------------------------------------------------------------------------------

    async def _call(self, path: str, body: dict[str, Any], *, timeout_ms: int | None = None) -> dict[str, Any]:
        """One gateway call, moved to the next member while the cluster cannot answer.

        Raises:
            _EtcdRefused: etcd answered with an error that another member would repeat.
            BackendUnavailable: no member answered by the deadline.
        """
        deadline = time.monotonic() + (timeout_ms or self.timeout_ms) / 1000
        data = json.dumps(body).encode()
        failure = "no member tried"
        # Only a revision seen before this call began bounds its answer: a call that ran
        # alongside (a keepalive, another task's acquire) may be linearized before it.
        floor = self._revision_seen
        while True:
            index = self._preferred
            client = self._clients[index]
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise BackendUnavailable(f"etcd: no member answered {path} in time ({failure})")
            try:
                response = await client.request(
                    "POST", path, body=data, content_type="application/json",
                    timeout_ms=min(remaining_ms, max(_ATTEMPT_MS_MIN, (timeout_ms or self.timeout_ms) // 8)),
                    idempotent=True,
                )
                text = response.body.split(b"\n", 1)[0] if path.endswith("keepalive") else response.body
                answer = json.loads(text or b"{}")
            except BackendUnavailable as exc:
                failure = str(exc)
            except ValueError as exc:
                failure = f"not JSON: {exc}"
            else:
                if response.status == 200:
                    answer = answer.get("result", answer) if path.endswith("keepalive") else answer
                    if path.startswith("/v3/kv/"):
                        # Only what reads or writes keys is linearizable: a keepalive's header
                        # shows the leader's applied revision, which may trail a follower's.
                        self._check_revision(answer, floor)
                    elif path == "/v3/maintenance/status":
                        # A member's applied revision: no later linearizable answer is lower.
                        self._revision_seen = max(self._revision_seen, recipe.revision_of(answer))
                    return answer
                code = int(answer.get("code", 0)) if isinstance(answer, dict) else 0
                message = str(answer.get("error", response.status)) if isinstance(answer, dict) else ""
                if code not in _RETRY_CODES and response.status < 500:
                    raise _EtcdRefused(code, message)
                failure = f"{self._members[index].host}:{self._members[index].port}: {message}"
            self._preferred = (index + 1) % len(self._clients)
            if self._preferred == 0:
                await AsyncIO.sleep(_RETRY_PAUSE_S)

    def _check_revision(self, answer: dict[str, Any], floor: int) -> None:
        """Refuse an answer older than what this client saw before the call began (a restored etcd)."""
        header = answer.get("header")
        if not isinstance(header, dict) or "revision" not in header:
            return
        revision = int(header["revision"])
        if revision < floor:
            raise BackendUnavailable(
                f"etcd's revision went back from {floor} to {revision}: restored from a snapshot? "
                "tokens would repeat; refusing (docs/coordinator-etcd.md)", certain_no_effect=True,
            )
        self._revision_seen = max(self._revision_seen, revision)

    async def _txn(self, body: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], int]:
        """A Txn: whether its compare held, its branch's answers, and its revision (the store's, after it)."""
        answer = await self._call("/v3/kv/txn", body)
        return bool(answer.get("succeeded")), list(answer.get("responses", [])), recipe.revision_of(answer)

    async def _range(self, key: bytes, end: bytes | None = None, **options: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"key": recipe.b64(key), **options}
        if end is not None:
            body["range_end"] = recipe.b64(end)
        return await self._call("/v3/kv/range", body)

    async def _keepalive(self, lease: int) -> bool:
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("TTL", 0)) > 0

    async def _revoke(self, lease: int) -> bool:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except _EtcdRefused as exc:
            if exc.grpc_code == _NOT_FOUND:
                return False
            raise BackendUnavailable(f"etcd refused to revoke a lease: {exc}") from exc
        return True

    async def _wait_deleted(self, key: bytes, start_revision: int, timeout_s: float) -> None:
        """Return when ``key`` is deleted at or after ``start_revision``, its watch ends, or ``timeout_s`` passes."""
        if not await wait_deleted(self._members[self._preferred], key, start_revision, timeout_s):
            self._preferred = (self._preferred + 1) % len(self._clients)
            await AsyncIO.sleep(min(_RETRY_PAUSE_S, max(0.0, timeout_s)))

    # -- the port ---------------------------------------------------------------------------------

    def identity(self) -> tuple[str, FixedKeys]:
        """The cluster id and keyring `open` read (for a port made without I/O: the async one in a loop)."""
        if self._cluster_id is None or self.keys is None:
            raise BackendUnavailable("etcd coordinator not opened", certain_no_effect=True)
        return self._cluster_id, self.keys

    async def open(self) -> None:
        if self._cluster_id is not None:
            return
        # Read first: a transaction is a raft entry even when its compare fails, and each one on a
        # restored cluster would raise the difference `restored` compares (one per process opened).
        cluster_kvs = recipe.kvs_of(await self._range(self._layout.cluster_key))
        keyring_kvs = recipe.kvs_of(await self._range(self._layout.keyring_key)) if cluster_kvs else []
        if not cluster_kvs:
            proposed = new_cluster_id()
            _, responses, _ = await self._txn(
                recipe.cluster_txn(self._layout, proposed, _dump(ephemeral_keyring(proposed)))
            )
            cluster_kvs = recipe.kvs_of(responses[-2].get("response_range", {}))
            keyring_kvs = recipe.kvs_of(responses[-1].get("response_range", {}))
        if not cluster_kvs or not keyring_kvs:
            raise BackendUnavailable("etcd holds a stockade cluster id without its keyring", certain_no_effect=True)
        keyring = _parse(keyring_kvs[0].value, Path("etcd:stockade/meta/keyring"))
        self.keys = FixedKeys(keyring)
        self._cluster_id = cluster_kvs[0].value.decode()

    # -- restores ---------------------------------------------------------------------------------

    async def incarnation(self) -> recipe.Incarnation:
        """etcd's cluster id and raft-index-minus-revision gap, from one member's status (no raft entry)."""
        return recipe.incarnation_of(await self._call("/v3/maintenance/status", {}))

    async def recorded_incarnation(self, *, record: recipe.Incarnation | None = None) -> recipe.Incarnation | None:
        """What ``meta/incarnation`` holds; with ``record``, write it first if none is held.

        A held marker is read with a range, not a transaction: a transaction is a raft entry,
        and each such entry on a restored cluster would raise the gap `restored` compares.
        """
        held = recipe.kvs_of(await self._range(self._layout.incarnation_key))
        if held or record is None:
            return recipe.marker_of(held[0] if held else None)
        _, responses, _ = await self._txn(recipe.marker_txn(self._layout, record))
        return recipe.marker_of(next(iter(recipe.kvs_of(responses[-1].get("response_range", {}))), None))

    async def restored(self) -> str | None:
        """Why etcd looks restored from a snapshot since stockade recorded it (None: it does not).

        One status read; the recorded marker is read on the first check and again on
        every check that fails (``stockade etcd bump-revision`` may have confirmed since).
        An acquire checks when the last check that passed is a second old, or none did.
        """
        started_ns = time.monotonic_ns()
        now = await self.incarnation()
        if self._marker is None or recipe.restored_reason(self._marker, now) is not None:
            self._marker = await self.recorded_incarnation(record=recipe.recordable(now))
        reason = recipe.restored_reason(self._marker, now)
        self._checked_ns = started_ns if reason is None else None
        return reason

    async def bump(self) -> int:
        """One write to the scratch key: the revision it made."""
        return recipe.revision_of(await self._call("/v3/kv/put", recipe.bump_put(self._layout)))

    async def confirm_incarnation(self) -> recipe.Incarnation:
        """Record the cluster as it is now as stockade's own: grants resume (after a revision bump)."""
        now = recipe.recordable(await self.incarnation())
        await self._call("/v3/kv/put", recipe.confirm_put(self._layout, now))
        self._marker = now
        return now

    async def _grant(self, scope: str, holder: str, ttl_ms: int, lease: int, revision: int, sent_ns: int,
                     previous: recipe.KV | None, *, doubt: bool = False) -> Grant:
        """The grant of ``revision``, after the lock-delay when the previous holder's lease lapsed (C5).

        etcd keeps no clock a client could read, so the delay counts from when this
        client saw the lapse, which is after it happened: never shorter than asked,
        and up to twice as long. The token is recorded already; nobody uses it meanwhile.
        ``doubt``: the previous holder is not known (a retried grant whose first answer was
        lost, and the journal does not show a release before it), so the delay is waited.
        """
        if self._cluster_id is None or self.keys is None:
            raise BackendUnavailable("etcd coordinator not opened", certain_no_effect=True)
        previous_token, released = recipe.last_of(previous)
        seen_ns = self.clock.now_ns()
        end_ns = self.lock_delay_end_ns(lapsed=doubt or (0 < previous_token < revision and not released),
                                        ended_ns=seen_ns, lock_delay_ms=self.lock_delay_ms)
        if end_ns > seen_ns:
            sent_ns = await self._hold_back(lease, sent_ns, recipe.ttl_s_of(ttl_ms), end_ns)
        token = self.keys.sign(FencingToken(self._cluster_id, scope, revision))
        lease_id = f"{lease}.{revision}.{scope}"
        if len(self._granted) >= self._prune_at:
            self._forget_lapsed()
        self._granted[lease] = lease_id
        self._renewed[lease] = sent_ns
        self._key_checked[lease] = sent_ns
        self._ttl_ms[lease] = ttl_ms
        return Grant(lease_id, holder, token, ttl_ms, sent_ns)

    async def _hold_back(self, lease: int, sent_ns: int, ttl_s: int, end_ns: int) -> int:
        """Wait until ``end_ns`` (the lock-delay's end), keeping the lease alive; the send time of its last renewal."""
        keepalive_ns = ttl_s * 1_000_000_000 // 3
        while (now_ns := self.clock.now_ns()) < end_ns:
            if now_ns - sent_ns >= keepalive_ns:
                sent_ns = now_ns
                if not await self._keepalive(lease):
                    raise BackendUnavailable("the etcd lease expired during the lock-delay")
            await AsyncIO.sleep(min(end_ns - now_ns, sent_ns + keepalive_ns - now_ns) / 1e9)
        return sent_ns

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Queue a key under a fresh etcd lease; granted when no key of the scope was created before it.

        ``wait_ms=None``: no deadline; the key keeps its place (its create revision)
        while this call keeps its etcd lease alive, until granted or cancelled.

        Returns:
            The grant; ``sent_ns`` is when the etcd lease was last granted or
            kept alive (the server's expiry counts from later than that: K2).
        """
        await self.open()
        ttl_s = recipe.ttl_s_of(ttl_ms)
        checked_ns = self._checked_ns
        if checked_ns is None or time.monotonic_ns() - checked_ns >= _RESTORE_CHECK_NS:
            reason = await self.restored()  # before the lease grant: a refusal writes no raft entry
        else:
            reason = None
        if reason is not None:
            raise BackendUnavailable(
                f"{reason}: etcd was restored from a snapshot, and its tokens would repeat issued ones; no grant "
                "until `stockade etcd bump-revision` has run (docs/coordinator-etcd.md)", certain_no_effect=True,
            )
        if self.journal.sweep_due:
            await self.journal.sweep()
        deadline_ns = wait_deadline_ns(time.monotonic_ns(), wait_ms)
        sent_ns = time.monotonic_ns()
        spare = self._spare(ttl_s, sent_ns)
        if spare is not None:
            lease, sent_ns = spare
        else:
            answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)})
            lease = int(answer["ID"])
        try:
            head = await self.journal.head(scope)
            body, after = recipe.enqueue_txn(self._layout, scope, lease, holder, ttl_ms, head=head, at_unix_ms=now_ms())
            succeeded, responses, txn_revision = await self._txn(body)
            mine = recipe.kvs_of(responses[3 if succeeded else 1].get("response_range", {}))
            if not mine:
                raise BackendUnavailable("etcd lost a queue key as it was written (its lease expired)")
            revision = mine[0].create_revision
            if succeeded:
                self.journal.journaled(scope, settled(after, txn_revision))
                previous = recipe.kvs_of(responses[0].get("response_range", {}))
                last = previous[0] if previous else None
                return await self._grant(scope, holder, ttl_ms, lease, revision, sent_ns, last)
            self.journal.remember(scope, head_in(responses[2]))
            keepalive_ns = ttl_s * 1_000_000_000 // 3
            while True:
                _, reads, read_revision = await self._txn(recipe.waiter_read(self._layout, scope, revision))
                predecessors = recipe.kvs_of(reads[0].get("response_range", {}))
                if not predecessors:
                    return await self._grant_first(scope, holder, ttl_ms, lease, revision, sent_ns,
                                                   head_in(reads[1]))
                now_ns = time.monotonic_ns()
                if now_ns >= deadline_ns:
                    raise LockTimeout(scope, wait_ms or 0)
                if now_ns - sent_ns >= keepalive_ns:
                    sent_ns = now_ns
                    if not await self._keepalive(lease):
                        raise BackendUnavailable("the waiter's etcd lease expired while it waited")
                wake_ns = min(deadline_ns, sent_ns + keepalive_ns)
                await self._wait_deleted(predecessors[0].key, read_revision + 1, max(0, wake_ns - now_ns) / 1e9)
        except BaseException:
            # Timed out, cancelled or failed: leave the queue (the key goes with its lease).
            try:
                await self._revoke(lease)
            except Exception:  # noqa: BLE001 - best effort: the lease expires by its TTL
                pass
            raise

    async def _grant_first(self, scope: str, holder: str, ttl_ms: int, lease: int, revision: int, sent_ns: int,
                           head: Head) -> Grant:
        """First in the queue: record the grant (and its history) if the key is still ours.

        Raises:
            BackendUnavailable: the waiter's etcd lease expired, or the history head kept moving.
        """
        for _ in range(_HEAD_TRIES):
            if head.open_token == revision:  # an earlier send of this Txn landed; its answer was lost
                released = released_before(await self.journal.history(scope, 2), revision)
                return await self._grant(scope, holder, ttl_ms, lease, revision, sent_ns, None, doubt=not released)
            body, after = recipe.grant_txn(self._layout, scope, lease, revision, holder=holder, head=head,
                                           at_unix_ms=now_ms())
            granted, read, txn_revision = await self._txn(body)
            if granted:
                self.journal.journaled(scope, settled(after, txn_revision))
                previous = recipe.kvs_of(read[0].get("response_range", {}))
                return await self._grant(scope, holder, ttl_ms, lease, revision, sent_ns,
                                         previous[0] if previous else None)
            key = recipe.kvs_of(read[0].get("response_range", {}))
            if not key or key[0].create_revision != revision:
                raise BackendUnavailable("the waiter's etcd lease expired while it waited")
            head = head_in(read[1])
            self.journal.remember(scope, head)
        raise BackendUnavailable(f"the history head of {scope!r} kept moving: {_HEAD_TRIES} grant Txns failed")

    async def history(self, scope: str, *, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first (`AsyncEtcdJournal.history`)."""
        return await self.journal.history(scope, limit)

    def _spare(self, ttl_s: int, now_ns: int) -> tuple[int, int] | None:
        """A released etcd lease of ``ttl_s`` to grant again, and the send time of its last renewal.

        Reusing it saves two of a cycle's four raft writes (a grant and a revoke), as an
        etcd session does. Only a lease renewed within the last third of its TTL is
        reused: the client's deadline (K2) counts from that renewal's send time.
        """
        while True:
            try:
                lease, spare_ttl_s, sent_ns = self._spares.pop()  # list.pop: atomic between threads too
            except IndexError:
                return None
            self._pooled.discard(lease)
            if spare_ttl_s == ttl_s and now_ns - sent_ns < ttl_s * 1_000_000_000 // 3:
                return lease, sent_ns
            # Not fit: it lapses by its TTL with no key on it (a revoke would cost a round trip now).

    async def renew(self, lease_id: str) -> None:
        parsed = _lease_of(lease_id)
        if parsed is None or parsed[0] in self._pooled or self._granted.get(parsed[0], lease_id) != lease_id:
            # Not this id's lease any more: released (and perhaps granted again to another id).
            raise NotHolder(core_leases.lease_hint(lease_id), "lease released")
        sent_ns = time.monotonic_ns()
        if not await self._keepalive(parsed[0]):
            self._forget(parsed[0])
            raise NotHolder(core_leases.lease_hint(lease_id), "etcd lease expired or revoked")
        if sent_ns - self._key_checked.get(parsed[0], 0) >= _RESTORE_CHECK_NS:
            # The lease alone is not the hold: after a snapshot restore, an etcd lease older than the
            # snapshot lives on while the holder key made after it is gone (and its token will be
            # issued again). Read (no raft entry) once a second, not on every renewal of a short TTL.
            key = recipe.kvs_of(await self._range(self._layout.queue_key(parsed[2], parsed[0])))
            if not key or key[0].create_revision != parsed[1]:
                raise NotHolder(core_leases.lease_hint(lease_id), "the holder's etcd key is gone (etcd restored?)")
            self._key_checked[parsed[0]] = sent_ns
        self._renewed[parsed[0]] = sent_ns

    def _forget(self, lease: int) -> None:
        self._granted.pop(lease, None)
        self._renewed.pop(lease, None)
        self._key_checked.pop(lease, None)
        self._ttl_ms.pop(lease, None)

    def _forget_lapsed(self) -> None:
        """Forget grants nobody renewed for twice their TTL: etcd expired them (a holder that
        vanished without a release). Run when the record doubles, so its cost is amortised
        and the record stays bounded by twice the leases alive."""
        now_ns = time.monotonic_ns()
        for lease in [lease for lease, sent_ns in self._renewed.items()
                      if now_ns - sent_ns > 2 * self._ttl_ms.get(lease, 0) * 1_000_000]:
            self._forget(lease)
        self._prune_at = max(_PRUNE_AT_MIN, 2 * len(self._granted))

    async def release(self, lease_id: str) -> bool:
        """Delete the key and mark the scope released in one revision (a lapse is what has no mark).

        The etcd lease of a grant this port made is kept for its next acquire of the same
        TTL (`_spare`); any other is revoked.
        """
        parsed = _lease_of(lease_id)
        if parsed is None:
            return False
        lease, token, scope = parsed
        mine = self._granted.get(lease) == lease_id
        if not mine and (lease in self._granted or lease in self._pooled):
            return False  # released already (its lease kept, or granted again to another id)
        released = await self._release_txn(scope, lease, token)
        if mine:
            self._granted.pop(lease, None)
            self._key_checked.pop(lease, None)
            sent_ns = self._renewed.pop(lease, 0)
            if released and len(self._spares) < _SPARES_MAX:
                self._pooled.add(lease)
                self._spares.append((lease, recipe.ttl_s_of(self._ttl_ms.pop(lease, 1000)), sent_ns))
                return True
            self._ttl_ms.pop(lease, None)
        revoked = await self._revoke(lease)
        return released and revoked

    async def _release_txn(self, scope: str, lease: int, token: int) -> bool:
        """Delete the holder key, mark the token released and journal the ``release``, in one Txn.

        Returns False, writing nothing, when the key is gone (the lease lapsed: its
        ``expire`` is the next grant's to write) or is another grant's.
        """
        head = self.journal.known(scope)
        holder = head.open_holder if head is not None and head.open_token == token else None
        for _ in range(_HEAD_TRIES):
            if head is None or holder is None:  # not the head this port last wrote: read both (no raft entry)
                _, reads, _ = await self._txn({"success": [
                    {"request_range": {"key": recipe.b64(self._layout.queue_key(scope, lease))}},
                    {"request_range": {"key": recipe.b64(self._layout.head_key(scope))}}]})
            else:
                body, after = recipe.release_txn(self._layout, scope, lease, token, holder=holder, head=head,
                                                 at_unix_ms=now_ms())
                released, reads, txn_revision = await self._txn(body)
                if released:
                    self.journal.journaled(scope, settled(after, txn_revision))
                    return True
            key = recipe.kvs_of(reads[0].get("response_range", {}))
            if not key or key[0].create_revision != token:
                return False
            head, holder = head_in(reads[1]), _shown(key[0])[0]
            self.journal.remember(scope, head)
        raise BackendUnavailable(f"the history head of {scope!r} kept moving: {_HEAD_TRIES} release Txns failed")

    async def inspect(self, scope: str) -> ScopeInfo:
        await self.open()
        start = self._layout.queue_prefix(scope)
        head_answer = await self._range(start, recipe.prefix_end(start), sort_order="ASCEND", sort_target="CREATE",
                                        limit="1")
        heads = recipe.kvs_of(head_answer)
        last = recipe.kvs_of(await self._range(self._layout.last_key(scope)))
        last_token = recipe.last_token_of(last[0] if last else None)
        if not heads:
            return ScopeInfo(scope, ScopeState.FREE, None, None, last_token, 0, 0)
        head = heads[0]
        holder, ttl_ms = _shown(head)
        alive = await self._call("/v3/lease/timetolive", {"ID": str(head.lease)})
        remaining_ms = max(0, min(ttl_ms, int(alive.get("TTL", 0)) * 1000))
        waiters = max(0, int(head_answer.get("count", 1)) - 1)
        invariant(self._cluster_id is not None, "inspect before open")
        token = FencingToken(str(self._cluster_id), scope, head.create_revision)
        last_token = max(last_token, head.create_revision)
        return ScopeInfo(scope, ScopeState.HELD, holder, token, last_token, remaining_ms, waiters)

    async def contenders(self, scope: str, *, limit: int) -> list[core_leases.Contender]:
        """The scope's queue keys in create-revision order (the order `acquire` serves them, C4), at most
        ``limit``: the first is the holder, as `inspect` shows it; each named by the holder its value records."""
        await self.open()
        start = self._layout.queue_prefix(scope)
        kvs = recipe.kvs_of(await self._range(start, recipe.prefix_end(start), sort_order="ASCEND",
                                              sort_target="CREATE", limit=str(limit)))
        return [core_leases.Contender(_shown(kv)[0], index == 0) for index, kv in enumerate(kvs[:limit])]

    async def _last_keys(self, after: str, limit: int) -> list[recipe.KV]:
        start = self._layout.last_prefix
        begin = start + after.encode() + b"\x00" if after else start
        return recipe.kvs_of(await self._range(begin, recipe.prefix_end(start), limit=str(limit)))

    async def scopes(self, *, after: str, limit: int) -> list[ScopeInfo]:
        kvs = await self._last_keys(after, min(limit, LIST_PAGE_MAX))
        names = [self._layout.scope_of_last_key(kv.key) for kv in kvs]
        return [await self.inspect(name) for name in names]

    async def last_issued(self, scope: str) -> int:
        last = recipe.kvs_of(await self._range(self._layout.last_key(scope)))
        return recipe.last_token_of(last[0] if last else None)

    async def fence_floors(self) -> FenceFloors:
        kvs = await self._last_keys("", _FLOORS_MAX)
        if len(kvs) >= _FLOORS_MAX:
            raise BackendUnavailable(f"more than {_FLOORS_MAX} scopes: fence floors not read in one page")
        return FenceFloors({self._layout.scope_of_last_key(kv.key): recipe.last_token_of(kv) for kv in kvs})

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


def _endpoint(member: recipe.EtcdMember, timeout_ms: int, connect_timeout_ms: int) -> HTTPEndpoint:
    authority = f"[{member.host}]:{member.port}" if ":" in member.host else f"{member.host}:{member.port}"
    return HTTPEndpoint(member.host, member.port, "", None, authority, None, timeout_ms, connect_timeout_ms)


def _shown(key: recipe.KV) -> tuple[str, int]:
    """The holder and ``ttl_ms`` a queue key names (``("?", 0)`` when its value is not stockade's)."""
    try:
        shown = json.loads(key.value)
        return str(shown["holder"]), int(shown["ttl_ms"])
    except (ValueError, KeyError, TypeError):
        return "?", 0


def _lease_of(lease_id: str) -> tuple[int, int, str] | None:
    """``LEASE.TOKEN.SCOPE`` (what `_grant` names a lease) as its parts; None for anything else."""
    if not isinstance(lease_id, str):
        return None
    lease, _, rest = lease_id.partition(".")
    token, _, scope = rest.partition(".")
    if not (lease.isdigit() and token.isdigit() and len(lease) <= 20 and len(token) <= 20 and scope):
        return None
    try:
        return int(lease), int(token), validate_scope(scope)
    except InvalidArgument:
        return None
