"""The lease table: grant, renew, release, expire, FIFO waiters, lock-delay.

Sans-IO. Every operation is a pure function from ``(ScopeRecord, request,
now_ns)`` to ``(ScopeRecord, outcome)``: adapters load a scope's record,
call the function inside one transaction, write back the new record and
commit before they answer (that commit is what makes a token durable, C1).
An operation that is not allowed raises and, being pure, changes nothing.

A scope is in one of three named states; the transition table below is the
specification (docs are generated from it)::

    FREE     --grant-->       HELD
    HELD     --renew-->       HELD
    HELD     --release-->     FREE
    HELD     --expire-->      DELAYED   (lock-delay, C5; zero delay means FREE at once)
    DELAYED  --delay_over-->  FREE

Rules kept here:

- C1: the token of a grant is ``last_token + 1`` of the scope's record. The
  record, not the lease, owns ``last_token``, so releases and expiries never
  lower it.
- C2: at most one unexpired lease per scope, by the coordinator's clock.
- C3: only ``now_ns`` passed in by the coordinator decides expiry.
- C4: waiters are served strictly first in, first out; each has a deadline
  and a liveness deadline (``stale_ns``) so a dead waiter cannot block the queue.
- C5: optional lock-delay after an expiry (not after a release).

An acquire repeated with the lease id of the current lease (a duplicated or
retried request) returns that lease again: it never mints a second token.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace

from stockade.core.errors import InvalidArgument, LimitExceeded, NotHolder, invariant
from stockade.core.limits import (
    CONTENDERS_MAX,
    LOCK_DELAY_MS_MAX,
    TOKEN_VALUE_MAX,
    TOKEN_VALUE_MIN,
    WAITERS_PER_SCOPE_MAX,
    validate_holder,
    validate_int,
    validate_scope,
    validate_ttl_ms,
)
from stockade.core.tokens import FencingToken, validate_cluster_id

__all__ = [
    "ScopeState",
    "Event",
    "TRANSITIONS",
    "LeasePolicy",
    "Lease",
    "Waiter",
    "ScopeRecord",
    "AcquireRequest",
    "Granted",
    "Queued",
    "TimedOut",
    "Released",
    "state_of",
    "settle",
    "lock_delay_end_ns",
    "acquire",
    "renew",
    "release",
    "cancel_wait",
    "recover",
    "lease_hint",
    "validate_lease_id",
    "redact_lease_path",
    "ScopeInfo",
    "describe",
    "Contender",
    "contenders_of",
]

_NS_PER_MS = 1_000_000
# How a `prevalidated` request is built: as the frozen dataclass's own ``__init__`` sets its fields.
_new = object.__new__
_set = object.__setattr__
LEASE_ID_CHARS_MIN = 16
LEASE_ID_CHARS_MAX = 64


class ScopeState(enum.Enum):
    # Members are singletons compared by identity: hashed by identity too, in C (Enum's own hash is a
    # Python call, and `_transition` looks a pair up on every grant and release).
    __hash__ = object.__hash__

    FREE = "free"
    HELD = "held"
    DELAYED = "delayed"


class Event(enum.Enum):
    __hash__ = object.__hash__  # as ScopeState's

    GRANT = "grant"
    RENEW = "renew"
    RELEASE = "release"
    EXPIRE = "expire"
    DELAY_OVER = "delay_over"


TRANSITIONS: dict[tuple[ScopeState, Event], ScopeState] = {
    (ScopeState.FREE, Event.GRANT): ScopeState.HELD,
    (ScopeState.HELD, Event.RENEW): ScopeState.HELD,
    (ScopeState.HELD, Event.RELEASE): ScopeState.FREE,
    (ScopeState.HELD, Event.EXPIRE): ScopeState.DELAYED,
    (ScopeState.DELAYED, Event.DELAY_OVER): ScopeState.FREE,
}


def lease_hint(lease_id: str) -> str:
    """The non-secret prefix of a lease id that logs and errors may show."""
    return lease_id[:6]


_LEASE_PATH = re.compile(r"(/v1/leases/)([^/?]{0,6})[^/?]*")


def redact_lease_path(path: str) -> str:
    """A request path fit for messages and logs: no query, lease ids cut to their hint."""
    return _LEASE_PATH.sub(r"\1\2…", path.split("?", 1)[0])


_LEASE_ID_SHAPE = re.compile(f"[A-Za-z0-9_-]{{{LEASE_ID_CHARS_MIN},{LEASE_ID_CHARS_MAX}}}")


def validate_lease_id(lease_id: object) -> str:
    """Raise `InvalidArgument` unless ``lease_id`` has the shape of a lease id.

    ASCII letters, digits, ``-`` and ``_``; 16..64 of them. The common case is
    one regular-expression match (the server checks every renew and release).
    """
    if type(lease_id) is str and _LEASE_ID_SHAPE.fullmatch(lease_id):
        return lease_id
    return _validate_lease_id(lease_id)


def _validate_lease_id(lease_id: object) -> str:
    if not isinstance(lease_id, str) or not LEASE_ID_CHARS_MIN <= len(lease_id) <= LEASE_ID_CHARS_MAX:
        raise InvalidArgument("lease_id", f"must be a string of {LEASE_ID_CHARS_MIN}..{LEASE_ID_CHARS_MAX} characters")
    if not lease_id.isascii() or not all(c.isalnum() or c in "-_" for c in lease_id):
        raise InvalidArgument("lease_id", "may contain only A-Z a-z 0-9 - _")
    return lease_id


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """Coordinator-wide settings, validated at construction.

    Attributes:
        lock_delay_ms: after an expiry, the scope stays ungrantable this long (C5).
        waiters_per_scope_max: queue bound per scope; one more raises `LimitExceeded`.
        waiter_stale_ms: a waiter not seen for this long is presumed dead and dropped.
    """

    lock_delay_ms: int = 0
    waiters_per_scope_max: int = WAITERS_PER_SCOPE_MAX
    waiter_stale_ms: int = 2_000

    def __post_init__(self) -> None:
        validate_int("lock_delay_ms", self.lock_delay_ms, 0, LOCK_DELAY_MS_MAX)
        validate_int("waiters_per_scope_max", self.waiters_per_scope_max, 1, WAITERS_PER_SCOPE_MAX)
        validate_int("waiter_stale_ms", self.waiter_stale_ms, 100, 60_000)


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease. ``expires_ns`` is on the coordinator's monotonic clock."""

    lease_id: str
    holder: str
    token: FencingToken
    ttl_ms: int
    granted_ns: int
    expires_ns: int

    @property
    def scope(self) -> str:
        return self.token.scope


@dataclass(frozen=True, slots=True)
class Waiter:
    """A queued acquire. ``deadline_ns``: gives up; ``stale_ns``: presumed dead."""

    lease_id: str
    holder: str
    deadline_ns: int
    stale_ns: int


@dataclass(frozen=True, slots=True)
class ScopeRecord:
    """Everything the coordinator knows about one scope."""

    scope: str
    last_token: int = 0
    lease: Lease | None = None
    delay_until_ns: int = 0
    waiters: tuple[Waiter, ...] = ()


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    """One attempt to acquire ``scope``; repeat it (same ``lease_id``) to keep waiting.

    ``lease_id`` is chosen by the caller (a secret random string): it names the
    waiter while queued and the lease once granted. ``live_until_ns``: until
    when a queued request counts as alive without being repeated (None: the
    policy's ``waiter_stale_ms`` from now; a server holding the request open
    vouches for it until its wait deadline).
    """

    cluster: str
    scope: str
    lease_id: str
    holder: str
    ttl_ms: int
    wait_deadline_ns: int
    live_until_ns: int | None = None

    def __post_init__(self) -> None:  # the boundary every request passes, unless `prevalidated`
        validate_cluster_id(self.cluster)
        validate_scope(self.scope)
        validate_lease_id(self.lease_id)
        validate_holder(self.holder)
        validate_ttl_ms(self.ttl_ms)
        validate_int("wait_deadline_ns", self.wait_deadline_ns, 0, 2**63 - 1)
        if self.live_until_ns is not None:
            validate_int("live_until_ns", self.live_until_ns, 0, 2**63 - 1)

    @classmethod
    def prevalidated(cls, cluster: str, scope: str, lease_id: str, holder: str, ttl_ms: int, wait_deadline_ns: int,
                     live_until_ns: int | None = None) -> AcquireRequest:
        """A request of values checked already, built without checking them again: the trusted entry.

        Only for a caller that checked ``scope``, ``holder`` and ``ttl_ms`` at its own boundary
        with the validators of `stockade.core.limits` (the same rules as the constructor),
        minted ``lease_id`` itself and read the deadlines from its clock: ``stockade serve``'s
        acquire (its input parsed by the app). ``cluster`` is the engine's own (checked when
        the engine was made). Every other caller builds a request with the constructor.
        """
        request = _new(cls)
        _set(request, "cluster", cluster)
        _set(request, "scope", scope)
        _set(request, "lease_id", lease_id)
        _set(request, "holder", holder)
        _set(request, "ttl_ms", ttl_ms)
        _set(request, "wait_deadline_ns", wait_deadline_ns)
        _set(request, "live_until_ns", live_until_ns)
        return request


@dataclass(frozen=True, slots=True)
class Granted:
    lease: Lease


@dataclass(frozen=True, slots=True)
class Queued:
    """Not granted yet; ``position`` is 0 for the head of the queue."""

    position: int
    holder: str | None


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The wait deadline passed; the waiter has been removed from the queue."""


@dataclass(frozen=True, slots=True)
class Released:
    """``released`` is False when the lease was already gone (release is idempotent).

    ``at_ns`` is the coordinator time of the release: no later grant of the
    scope can carry an earlier ``granted_ns``.
    """

    released: bool
    at_ns: int


def state_of(record: ScopeRecord, now_ns: int) -> ScopeState:
    """The named state of a scope at ``now_ns`` (an unsettled expired lease counts as expired)."""
    if record.lease is not None and now_ns < record.lease.expires_ns:
        return ScopeState.HELD
    delay_until = record.delay_until_ns
    if record.lease is not None:
        delay_until = max(delay_until, record.lease.expires_ns)
    return ScopeState.DELAYED if now_ns < delay_until else ScopeState.FREE


def lock_delay_end_ns(*, lapsed: bool, ended_ns: int, lock_delay_ms: int) -> int:
    """C5, the one lock-delay decision: the earliest time a scope may be granted again.

    Every coordinator decides it here, each on its own clock, which the caller
    reads and passes in: the lease engine (a lease's deadline, and the restart
    rule in `recover`) on the coordinator's monotonic clock; the etcd and
    ZooKeeper ports, which keep no clock of the backend a client could read, on
    the client's, at the moment the client saw the previous lease end (after it
    ended, so the delay is never shorter than asked).

    - the last lease was released: from ``ended_ns``, at once;
    - it lapsed, or how it ended is not known: from ``ended_ns + lock_delay_ms``.

    Args:
        lapsed: the lease expired without a release, or how it ended is not known
            (a caller in doubt passes True: waiting is safe, granting early is not).
        ended_ns: when it ended (or was seen to end), on the caller's clock.
        lock_delay_ms: the coordinator's lock-delay (`LeasePolicy.lock_delay_ms`; 0: none).

    Returns:
        The time, on the caller's clock, before which no grant of the scope may be made.
    """
    return ended_ns + lock_delay_ms * _NS_PER_MS if lapsed else ended_ns


def _transition(state: ScopeState, event: Event) -> ScopeState:
    if (state, event) not in TRANSITIONS:  # the message is built only then: this runs on every grant and release
        invariant(False, f"illegal transition {state.name} --{event.name}-->")
    return TRANSITIONS[(state, event)]


def settle(record: ScopeRecord, now_ns: int, policy: LeasePolicy) -> ScopeRecord:
    """Apply what time alone decides: expire a lapsed lease, drop lapsed waiters."""
    lease = record.lease
    if lease is not None and now_ns >= lease.expires_ns:
        _transition(ScopeState.HELD, Event.EXPIRE)
        record = replace(
            record,
            lease=None,
            delay_until_ns=max(record.delay_until_ns, lock_delay_end_ns(
                lapsed=True, ended_ns=lease.expires_ns, lock_delay_ms=policy.lock_delay_ms)),
        )
    if record.waiters:
        alive = tuple(w for w in record.waiters if now_ns < w.deadline_ns and now_ns < w.stale_ns)
        if len(alive) != len(record.waiters):
            record = replace(record, waiters=alive)
    return record


def acquire(
    record: ScopeRecord, request: AcquireRequest, now_ns: int, policy: LeasePolicy
) -> tuple[ScopeRecord, Granted | Queued | TimedOut]:
    """Grant the scope to ``request`` if it is free and the request heads the queue.

    Otherwise queue it (or keep it queued and alive), or time it out once
    ``now_ns`` reaches its wait deadline.

    Raises:
        LimitExceeded: the scope's queue is full, or the token space is used up.
    """
    if record.scope != request.scope:  # the message is built only then: every grant runs this
        invariant(False, "record and request name different scopes")
    record = settle(record, now_ns, policy)
    lease = record.lease
    if lease is not None and lease.lease_id == request.lease_id:
        return record, Granted(lease)  # a repeated request: same lease, same token
    position = next((i for i, w in enumerate(record.waiters) if w.lease_id == request.lease_id), None) \
        if record.waiters else None
    free = lease is None and now_ns >= record.delay_until_ns
    my_turn = position == 0 or (position is None and not record.waiters)
    if free and my_turn:
        return _grant(record, request, now_ns)
    if now_ns >= request.wait_deadline_ns:
        waiters = tuple(w for w in record.waiters if w.lease_id != request.lease_id)
        return replace(record, waiters=waiters), TimedOut()
    stale_ns = now_ns + policy.waiter_stale_ms * _NS_PER_MS
    if request.live_until_ns is not None:
        stale_ns = request.live_until_ns
    holder = lease.holder if lease is not None else None
    if position is None:
        if len(record.waiters) >= policy.waiters_per_scope_max:
            raise LimitExceeded("waiters_per_scope_max", policy.waiters_per_scope_max, f"scope {record.scope!r}")
        waiter = Waiter(request.lease_id, request.holder, request.wait_deadline_ns, stale_ns)
        return replace(record, waiters=record.waiters + (waiter,)), Queued(len(record.waiters), holder)
    waiter = record.waiters[position]
    # Refresh liveness only when half the window is used: fewer writes while polling.
    if waiter.stale_ns - now_ns < policy.waiter_stale_ms * _NS_PER_MS // 2:
        refreshed = list(record.waiters)
        refreshed[position] = replace(waiter, stale_ns=stale_ns)
        record = replace(record, waiters=tuple(refreshed))
    return record, Queued(position, holder)


def _grant(record: ScopeRecord, request: AcquireRequest, now_ns: int) -> tuple[ScopeRecord, Granted]:
    _transition(ScopeState.FREE, Event.GRANT)
    value = record.last_token + 1
    if value > TOKEN_VALUE_MAX:
        raise LimitExceeded("TOKEN_VALUE_MAX", TOKEN_VALUE_MAX, f"scope {record.scope!r} has no tokens left")
    if value < TOKEN_VALUE_MIN:
        invariant(False, f"last_token of {record.scope!r} is below 0")
    # Not checked again: the request's cluster and scope were (`AcquireRequest`), and ``value`` is bounded here
    # (above the record's ``last_token``, never negative, and at most TOKEN_VALUE_MAX).
    token = FencingToken.prevalidated(request.cluster, request.scope, value)
    lease = Lease(
        lease_id=request.lease_id,
        holder=request.holder,
        token=token,
        ttl_ms=request.ttl_ms,
        granted_ns=now_ns,
        expires_ns=now_ns + request.ttl_ms * _NS_PER_MS,
    )
    waiters = tuple(w for w in record.waiters if w.lease_id != request.lease_id) if record.waiters else ()
    # Built directly, as in `release`: `dataclasses.replace` costs several times the constructor on every grant.
    new = ScopeRecord(record.scope, value, lease, record.delay_until_ns, waiters)
    if not new.last_token > record.last_token:
        invariant(False, "token did not increase")
    return new, Granted(lease)


def renew(record: ScopeRecord, lease_id: str, now_ns: int, policy: LeasePolicy) -> tuple[ScopeRecord, Lease]:
    """Extend the current lease by its TTL from ``now_ns``.

    Raises:
        NotHolder: ``lease_id`` is not the scope's unexpired lease.
    """
    record = settle(record, now_ns, policy)
    lease = record.lease
    if lease is None or lease.lease_id != lease_id:
        raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
    _transition(ScopeState.HELD, Event.RENEW)
    lease = replace(lease, expires_ns=now_ns + lease.ttl_ms * _NS_PER_MS)
    return replace(record, lease=lease), lease


def release(record: ScopeRecord, lease_id: str, now_ns: int, policy: LeasePolicy) -> tuple[ScopeRecord, Released]:
    """Give up the lease named by ``lease_id``. Idempotent; never affects another lease."""
    record = settle(record, now_ns, policy)
    if record.lease is None or record.lease.lease_id != lease_id:
        return record, Released(False, now_ns)
    _transition(ScopeState.HELD, Event.RELEASE)
    return ScopeRecord(record.scope, record.last_token, None, record.delay_until_ns, record.waiters), \
        Released(True, now_ns)


def cancel_wait(record: ScopeRecord, lease_id: str) -> ScopeRecord:
    """Leave the queue (a waiter that gives up early). Idempotent."""
    return replace(record, waiters=tuple(w for w in record.waiters if w.lease_id != lease_id))


def recover(record: ScopeRecord, now_ns: int, policy: LeasePolicy, *, same_clock: bool) -> ScopeRecord:
    """The restart rule: what a coordinator coming back from its durable records must assume.

    This is the one copy of the rule; every backend, the server and the
    simulator call it when they reload (C3, C5):

    - A lease persisted as held stays held a full TTL from ``now_ns``, even if
      its deadline passed while the coordinator was down: its holder may still
      be working and cannot have learned otherwise (C3).
    - Queued waiters are dropped: their requests died with the process, and
      their deadlines may be on another clock.
    - A pending lock-delay is kept (C5). When the clock did not continue (a
      reboot, a failover to another host) nobody can tell whether a recorded
      delay is still pending, so any recorded delay starts again in full.

    Args:
        same_clock: ``now_ns`` is on the clock the record's times were written
            on (a process restart on the same boot). False after a reboot or
            when the times came from another host's clock.
    """
    lease = record.lease
    if lease is not None:
        expires_ns = now_ns + lease.ttl_ms * _NS_PER_MS
        granted_ns = now_ns
        if same_clock:
            expires_ns = max(expires_ns, lease.expires_ns)
            granted_ns = min(lease.granted_ns, now_ns)
        lease = replace(lease, granted_ns=granted_ns, expires_ns=expires_ns)
    delay_until_ns = record.delay_until_ns
    if not same_clock and delay_until_ns > 0:
        delay_until_ns = lock_delay_end_ns(lapsed=True, ended_ns=now_ns, lock_delay_ms=policy.lock_delay_ms)
    new = replace(record, lease=lease, waiters=(), delay_until_ns=delay_until_ns)
    return record if new == record else new


@dataclass(frozen=True, slots=True)
class ScopeInfo:
    """A read-only view of a scope for status displays (no lease id: it is a secret)."""

    scope: str
    state: ScopeState
    holder: str | None
    token: FencingToken | None
    last_token: int
    remaining_ms: int
    waiters: int


def describe(record: ScopeRecord, now_ns: int, policy: LeasePolicy) -> ScopeInfo:
    """Summarise a scope at ``now_ns``."""
    state = state_of(record, now_ns)
    record = settle(record, now_ns, policy)
    lease = record.lease
    return ScopeInfo(
        scope=record.scope,
        state=state,
        holder=lease.holder if lease else None,
        token=lease.token if lease else None,
        last_token=record.last_token,
        remaining_ms=max(0, (lease.expires_ns - now_ns) // _NS_PER_MS) if lease else 0,
        waiters=len(record.waiters),
    )


@dataclass(frozen=True, slots=True)
class Contender:
    """One party in a scope's line, as status displays may show it: its holder name, never its
    lease id (a secret) nor its token's MAC.

    Attributes:
        holder: the name the party acquired with (``holder=``, or an election's ``identity=``).
        holding: True for the scope's current holder (first in the list), False for a waiter.
    """

    holder: str
    holding: bool


def contenders_of(
    record: ScopeRecord, now_ns: int, policy: LeasePolicy, limit: int = CONTENDERS_MAX
) -> list[Contender]:
    """Who holds ``record``'s scope at ``now_ns`` and who waits, in the order they will be served (C4),
    at most ``limit`` of them: the holder first (if any), then the waiters, first queued first.

    Raises:
        InvalidArgument: ``limit`` is not in 1..`CONTENDERS_MAX`.
    """
    validate_int("limit", limit, 1, CONTENDERS_MAX)
    record = settle(record, now_ns, policy)
    line = [Contender(record.lease.holder, True)] if record.lease is not None else []
    line += [Contender(waiter.holder, False) for waiter in record.waiters[:limit]]
    return line[:limit]
