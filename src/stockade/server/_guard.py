"""The server's bounds across connections: timeouts, the connection cap, the buffered-bytes budget.

One `ConnectionLimits` per server. Each connection is in one of three states,
and the guard keeps the first two in order of age:

- *idle*: open, no request started, nothing running or queued. Closed after
  ``idle_timeout_s``; the oldest is closed first when the connection cap is reached.
- *reading*: a request has started and is not complete. Its headers must be
  complete within ``header_timeout_s`` and its body within ``body_timeout_s``,
  at ``body_rate_min`` bytes/s on average once `BODY_GRACE_S` have passed.
- *serving*: a handler runs (a long poll may wait minutes, bounded by its own
  ``wait_ms``); never timed out, never evicted.

Apart from these, a connection whose peer stops reading its answers (the send
buffer is full, or the connection is closing with bytes still unsent) is cut
off once it has stayed so for ``idle_timeout_s``.

When ``connections_max`` are open, a new connection closes the oldest idle one
(or a request reading for `STALE_S` or more) of the address holding the most
connections, or else the oldest idle one, or else the oldest request that has
been reading for `STALE_S` or more, of any; if there is none (every connection
is serving), the new one is refused with 503. Request bodies
buffered in memory, across all connections, stay under ``buffer_bytes_max``
(plus one read per connection): a body that would pass it first closes the
oldest partial bodies that started `STALE_S` ago or more, and if there are none
it is refused with 503 and ``Retry-After``. A small body (a JSON one, at most
`SMALL_BODY_BYTES`) closes the oldest partial bodies however young they are:
a flood of large bodies cannot keep acquires, renewals and releases out.
Honest requests complete in milliseconds, so the connections closed to make
room are the slow ones.

Fair shares: no one tenant may take the whole server. A *peer* is a source
address; a *credential* is a bearer token (auth on). Each has a bounded share:

- ``peer_connections_max`` open connections per peer address. A new connection
  past it first closes that peer's own oldest idle (or stale reading) connection,
  never another peer's; if it has none, the new one is answered 429.
- ``token_connections_max`` connections per credential: a connection counts for
  the credential of its latest request. A request past it closes the credential's
  own oldest idle connection, or is answered 429 and its connection closed.
- ``peer_waiters_max`` and ``token_waiters_max`` acquires waiting (``wait_ms`` > 0)
  at once per peer address and per credential: one more is answered 429 at once.

A refusal, for a share or at the connection cap (503), is a problem document
with ``Retry-After``; its connection stays open at most `DISCARD_SECONDS`
(counted in no share) to read the answer, and when more than `LINGER_MAX` are
so lingering, a refused connection is reset instead. A waiting acquire (a
*serving* connection) is never closed to make room, so a tenant past its share
cannot evict another's waiters: at most the sum of the shares it holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from stockade.core.errors import InvalidArgument

if TYPE_CHECKING:
    from stockade.server._http import HttpProtocol, Response

    # (method, raw path, headers, has a body) -> the refusal to send, or None
    Authorize = Callable[[str, str, dict[str, str], bool], "Response | None"]

__all__ = [
    "TransportSettings",
    "ConnectionLimits",
    "IDLE_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "BODY_TIMEOUT_S",
    "BODY_RATE_MIN",
    "CONNECTIONS_MAX",
    "BUFFER_BYTES_MAX",
    "BODY_GRACE_S",
    "STALE_S",
    "SMALL_BODY_BYTES",
    "RETRY_AFTER_S",
    "PEER_CONNECTIONS_MAX",
    "PEER_WAITERS_MAX",
    "TOKEN_CONNECTIONS_MAX",
    "TOKEN_WAITERS_MAX",
    "LINGER_MAX",
    "Refusal",
]

IDLE_TIMEOUT_S = 60.0  # a keep-alive connection with no request
HEADER_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers
BODY_TIMEOUT_S = 30.0  # from the end of the headers to the end of the body
BODY_RATE_MIN = 16 * 1024  # bytes/s, on average, once BODY_GRACE_S have passed
CONNECTIONS_MAX = 4096
BUFFER_BYTES_MAX = 64 * 1024 * 1024  # request bytes held in memory, all connections together
BODY_GRACE_S = 2.0
STALE_S = 1.0  # a partial request this old may be closed to make room for others
SMALL_BODY_BYTES = 64 * 1024  # a body this small fits in one read, and always finds room
RETRY_AFTER_S = 1
EVICT_SCAN = 256  # partial requests looked at, at most, to make room for one body read
PEER_CONNECTIONS_MAX = 4096  # open connections per source address (by default: the whole cap)
PEER_WAITERS_MAX = 256  # acquires waiting at once per source address
TOKEN_CONNECTIONS_MAX = 1024  # connections per bearer token (auth on)
TOKEN_WAITERS_MAX = 256  # acquires waiting at once per bearer token (auth on)
SHARE_MAX = 1_000_000  # the largest share a flag accepts (a share that large is no share)
LINGER_MAX = 512  # refused connections kept open briefly so that their peers read the refusal
DISCARD_SECONDS = 1.0  # how long a refused connection lingers, reading and dropping what comes

_log = logging.getLogger("stockade.server")
_Key = TypeVar("_Key", str, bytes)


class Refusal(NamedTuple):
    """Why a connection or request is refused (the transport answers it with Retry-After)."""

    code: str  # limit-exceeded (a share: 429) or backend-unavailable (the cap: 503)
    detail: str
    limit: str | None = None  # the share's name, e.g. peer_waiters_max
    value: int | None = None  # its size


@dataclass(frozen=True)
class TransportSettings:
    """The transport's numbers (`stockade serve` flags of the same names)."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    body_rate_min: int = BODY_RATE_MIN
    connections_max: int = CONNECTIONS_MAX
    buffer_bytes_max: int = BUFFER_BYTES_MAX
    peer_connections_max: int = PEER_CONNECTIONS_MAX
    peer_waiters_max: int = PEER_WAITERS_MAX
    token_connections_max: int = TOKEN_CONNECTIONS_MAX
    token_waiters_max: int = TOKEN_WAITERS_MAX

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.05 <= value <= 86_400:
                raise InvalidArgument(name, "must be 0.05..86400 seconds")
        for name, low, high in (("body_rate_min", 0, 1 << 30), ("connections_max", 1, 1_000_000),
                                ("buffer_bytes_max", 1 << 20, 1 << 40),
                                ("peer_connections_max", 1, SHARE_MAX), ("peer_waiters_max", 1, SHARE_MAX),
                                ("token_connections_max", 1, SHARE_MAX), ("token_waiters_max", 1, SHARE_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidArgument(name, f"must be an integer in {low}..{high}")

    @property
    def sweep_s(self) -> float:
        """How often the timeouts are checked: a quarter of the shortest, within 0.05..1 s."""
        return min(1.0, max(0.05, min(self.idle_timeout_s, self.header_timeout_s, self.body_timeout_s) / 4))


class ConnectionLimits:
    """Server-wide connection bookkeeping: states in age order, the byte budget, the sweeper.

    ``authorize(method, raw_path, headers, has_body)``, when set, is asked once a
    request's headers are complete: it returns the refusal to send (401, 403), or None.
    """

    def __init__(self, connections_max: int | None = None, settings: TransportSettings | None = None) -> None:
        self.settings = settings or TransportSettings()
        self.connections_max = connections_max or self.settings.connections_max
        self.open: dict[HttpProtocol, None] = {}
        self.idle: OrderedDict[HttpProtocol, float] = OrderedDict()
        self.reading: OrderedDict[HttpProtocol, float] = OrderedDict()
        self.bodies: OrderedDict[HttpProtocol, float] = OrderedDict()  # reading ones holding body bytes
        self.stalled: dict[HttpProtocol, float] = {}  # answers not read by the peer, or closing with unsent bytes
        self.buffered = 0  # request bytes held, all connections
        self.authorize: Authorize | None = None
        self.refused = 0
        self.evicted = 0
        self._timer: asyncio.TimerHandle | None = None
        # the shares: open connections by peer address and by credential (age order), waiters by both
        self.peers: dict[str, OrderedDict[HttpProtocol, None]] = {}
        self._by_size: dict[int, set[str]] = {}  # peers by their open connections: the largest in O(1)
        self._largest = 0
        self.credentials: dict[bytes, OrderedDict[HttpProtocol, None]] = {}
        self.peer_waiters: dict[str, int] = {}
        self.credential_waiters: dict[bytes, int] = {}
        self.lingering: set[HttpProtocol] = set()
        self.share_refused = 0

    # -- connection states ----------------------------------------------------------------------

    def admit(self, conn: HttpProtocol) -> Refusal | None:
        """Count ``conn`` in, making room if its peer's share or the cap is full; else the refusal to send.

        Past its peer's share, ``conn``'s own peer gives room (its oldest idle or
        stale connection), or ``conn`` is refused 429; at the server's cap, the
        oldest idle or stale connection of any peer, or ``conn`` is refused 503.
        """
        mine = self.peers.get(conn.peer)
        share = self.settings.peer_connections_max
        if mine is not None and len(mine) >= share and not self._evict_from(mine):
            return self._share_refusal("peer_connections_max", share, "connections from this address")
        if len(self.open) >= self.connections_max and not self._evict_one():
            self.refused += 1
            if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, ...: the log stays small under attack
                _log.warning("connection refused: %d open, all serving (%d refused so far)",
                             len(self.open), self.refused)
            return Refusal("backend-unavailable", f"the server holds its {self.connections_max} connections; retry")
        self.open[conn] = None
        self.idle[conn] = time.monotonic()
        self._peer_add(conn)
        self._start_sweeping()
        return None

    def tag(self, conn: HttpProtocol, authorization: str) -> Refusal | None:
        """Count ``conn`` for the credential of its request; the refusal to send if that share is full.

        A connection counts for one credential, its latest. Past the share, the
        credential's own oldest idle connection is closed to make room.
        """
        key = hashlib.blake2b(authorization.encode("latin-1"), digest_size=16).digest()
        if conn.credential == key or conn not in self.open:
            return None
        self._untag(conn)
        mine = self.credentials.get(key)
        share = self.settings.token_connections_max
        if mine is not None and len(mine) >= share and not self._evict_from(mine):
            return self._share_refusal("token_connections_max", share, "connections with this bearer token")
        self.credentials.setdefault(key, OrderedDict())[conn] = None
        conn.credential = key
        return None

    def wait_begin(self, peer: str, credential: bytes | None) -> Refusal | None:
        """Count one waiting acquire for ``peer`` and ``credential``; the 429 to answer if a share is full.
        Each successful call is paired with one `wait_end`."""
        settings = self.settings
        if self.peer_waiters.get(peer, 0) >= settings.peer_waiters_max:
            return self._share_refusal("peer_waiters_max", settings.peer_waiters_max,
                                       "waiting acquires from this address")
        if credential is not None and self.credential_waiters.get(credential, 0) >= settings.token_waiters_max:
            return self._share_refusal("token_waiters_max", settings.token_waiters_max,
                                       "waiting acquires with this bearer token")
        self.peer_waiters[peer] = self.peer_waiters.get(peer, 0) + 1
        if credential is not None:
            self.credential_waiters[credential] = self.credential_waiters.get(credential, 0) + 1
        return None

    def wait_end(self, peer: str, credential: bytes | None) -> None:
        _decrement(self.peer_waiters, peer)
        if credential is not None:
            _decrement(self.credential_waiters, credential)

    def linger(self, conn: HttpProtocol) -> bool:
        """Whether refused ``conn`` may stay open briefly for its peer to read the refusal (else reset it)."""
        if len(self.lingering) >= LINGER_MAX:
            return False
        self.lingering.add(conn)
        return True

    def _share_refusal(self, limit: str, share: int, what: str) -> Refusal:
        self.share_refused += 1
        if self.share_refused & (self.share_refused - 1) == 0:
            _log.warning("share full: %s=%d (%d refused so far)", limit, share, self.share_refused,
                         extra={"limit": limit})
        return Refusal("limit-exceeded", f"at most {share} {what} ({limit}); retry", limit, share)

    def _peer_add(self, conn: HttpProtocol) -> None:
        group = self.peers.setdefault(conn.peer, OrderedDict())
        size = len(group)
        group[conn] = None
        if size:
            self._by_size[size].discard(conn.peer)
        self._by_size.setdefault(size + 1, set()).add(conn.peer)
        self._largest = max(self._largest, size + 1)

    def _peer_remove(self, conn: HttpProtocol) -> None:
        group = self.peers.get(conn.peer)
        if group is None or conn not in group:
            return
        size = len(group)
        del group[conn]
        if not group:
            del self.peers[conn.peer]
        bucket = self._by_size[size]
        bucket.discard(conn.peer)
        if not bucket:
            del self._by_size[size]
            if size == self._largest:
                self._largest -= 1
        if size > 1:
            self._by_size.setdefault(size - 1, set()).add(conn.peer)

    def _evict_from(self, group: OrderedDict[HttpProtocol, None]) -> bool:
        """Close the oldest idle, or stale reading, connection of ``group`` (one peer's or credential's)."""
        now = time.monotonic()
        scan = EVICT_SCAN + min(max(self.settings.peer_waiters_max, self.settings.token_waiters_max), 4096)
        for scanned, victim in enumerate(group):
            if scanned >= scan:  # past its waiters (never closed), a group's first few hold an idle one
                break
            if victim in self.idle:
                self.forget(victim)
                victim.close_idle()
            elif now - self.reading.get(victim, now) >= STALE_S:
                self.forget(victim)
                victim.abort()
            else:
                continue
            self.evicted += 1
            return True
        return False

    def _untag(self, conn: HttpProtocol) -> None:
        if conn.credential is not None:
            _remove(self.credentials, conn.credential, conn)
            conn.credential = None

    def _evict_one(self) -> bool:
        """Make room at the cap: from the address holding the most connections first, then from any."""
        if self._largest and self._evict_from(self.peers[next(iter(self._by_size[self._largest]))]):
            return True
        if self.idle:
            victim = next(iter(self.idle))
            self.forget(victim)
            victim.close_idle()
        elif self.reading and time.monotonic() - next(iter(self.reading.values())) >= STALE_S:
            victim = next(iter(self.reading))
            self.forget(victim)
            victim.abort()
        else:
            return False
        self.evicted += 1
        return True

    # The three moves below run on every request: written with ``in`` and ``del`` (what ``pop(conn, None)``
    # does, without a call), and a key deleted before it is set goes last (what ``move_to_end`` does).

    def to_idle(self, conn: HttpProtocol, now: float) -> None:
        """``conn`` answered its request at ``now`` (`time.monotonic`, read once for the answer) and waits."""
        if conn in self.reading:
            del self.reading[conn]
        if conn in self.bodies:
            del self.bodies[conn]
        if conn in self.open:
            if conn in self.idle:
                del self.idle[conn]
            self.idle[conn] = now

    def to_reading(self, conn: HttpProtocol, started: float) -> None:
        if conn in self.idle:
            del self.idle[conn]
        if conn in self.open:
            if conn in self.reading:
                del self.reading[conn]
            self.reading[conn] = started

    def to_serving(self, conn: HttpProtocol) -> None:
        if conn in self.idle:
            del self.idle[conn]
        if conn in self.reading:
            del self.reading[conn]
        if conn in self.bodies:
            del self.bodies[conn]

    def stall(self, conn: HttpProtocol) -> None:
        """``conn``'s peer has stopped reading its answers (or it is closing with bytes unsent)."""
        self.stalled.setdefault(conn, time.monotonic())

    def unstall(self, conn: HttpProtocol) -> None:
        self.stalled.pop(conn, None)

    def forget(self, conn: HttpProtocol) -> None:
        self.stalled.pop(conn, None)
        self.lingering.discard(conn)
        if conn in self.open:
            del self.open[conn]
            self._peer_remove(conn)
            self._untag(conn)
        self.idle.pop(conn, None)
        self.reading.pop(conn, None)
        self.bodies.pop(conn, None)

    # -- the byte budget ------------------------------------------------------------------------

    def reserve(self, conn: HttpProtocol, size: int, small: bool = False) -> bool:
        """Count ``size`` more buffered bytes for ``conn``; False if the budget has no room even
        after closing partial bodies (the caller answers 503). See `room`."""
        if not self.room(conn, size, small):
            return False
        self.buffered += size
        if conn not in self.bodies and conn in self.reading:
            self.bodies[conn] = self.reading[conn]
        return True

    def room(self, conn: HttpProtocol, size: int, small: bool = False) -> bool:
        """Whether ``size`` more bytes fit, after closing partial bodies if they must: the oldest
        first, and only those that started `STALE_S` ago or more, unless ``conn``'s body is small
        (at most `SMALL_BODY_BYTES`: every JSON body), which any partial body makes room for."""
        limit = self.settings.buffer_bytes_max
        if self.buffered + size > limit:
            now = time.monotonic()
            victims: list[HttpProtocol] = []
            needed = self.buffered + size - limit
            for scanned, (victim, started) in enumerate(self.bodies.items()):
                if needed <= 0 or scanned >= EVICT_SCAN or (now - started < STALE_S and not small):
                    break
                held = victim.holds_bytes()
                if victim is not conn and held:
                    victims.append(victim)
                    needed -= held
            for victim in victims:
                self.evicted += 1
                self.forget(victim)
                victim.abort()  # gives its bytes back through release()
        return self.buffered + size <= limit

    def release(self, size: int) -> None:
        self.buffered -= size

    # -- timeouts -------------------------------------------------------------------------------

    def _start_sweeping(self) -> None:
        if self._timer is None:
            loop = asyncio.get_event_loop()
            self._timer = loop.call_later(self.settings.sweep_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.sweep()
        if self.open:
            self._start_sweeping()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sweep(self) -> None:
        now = time.monotonic()
        settings = self.settings
        deadline = now - settings.idle_timeout_s
        while self.idle:
            conn, since = next(iter(self.idle.items()))
            if since > deadline:
                break
            self.forget(conn)
            conn.close_idle()
        for conn in list(self.reading):
            conn.check_timeouts(now, settings)
        for conn, since in list(self.stalled.items()):
            if since <= deadline:  # a peer that has not read its answers for idle_timeout_s
                self.forget(conn)
                conn.abort()


def _remove(groups: dict[_Key, OrderedDict[HttpProtocol, None]], key: _Key, conn: HttpProtocol) -> None:
    group = groups.get(key)
    if group is not None:
        group.pop(conn, None)
        if not group:
            del groups[key]


def _decrement(counts: dict[_Key, int], key: _Key) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def raise_file_limit(connections_max: int) -> None:
    """Raise the soft limit on open files to fit ``connections_max`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections_max + 256  # the listening socket, the files, the executor, some slack
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):  # pragma: no cover - a platform that refuses
            return
        if new < wanted:
            _log.warning("open-file limit %d is below connections_max %d", new, connections_max)
