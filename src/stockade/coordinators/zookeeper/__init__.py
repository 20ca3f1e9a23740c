"""The ZooKeeper coordinator's recipe, sans-IO: the url, the node layout, the TTL bound, the records.

The client's port (`stockade.coordinators.zookeeper._async.port`) runs it over one kazoo
session per client (`stockade.coordinators.zookeeper.session`). Everything lives
under ``/stockade`` in the url's chroot::

    /stockade/meta/cluster       the stockade cluster id (16 hex), created once with the keyring
    /stockade/meta/keyring       the keyring that signs tokens
    /stockade/q/<scope>          a container node; its children are the queue
    /stockade/q/<scope>/n-<seq>  a waiter or the holder: EPHEMERAL_SEQUENTIAL, owned by the session
    /stockade/tick/<scope>       touched in the same transaction as every queue node (its fence floor)
    /stockade/last/<scope>       ``<token> released|lapsed <tick version>``: how the last holder left
    /stockade/hist/<scope>       the scope's lease journal: its record, and its events as children
                                 (`stockade.coordinators.zookeeper._journal`)

The holder is the queue node with the lowest sequence number; a waiter
watches the node just before its own, so a release wakes one waiter (C4).
The **token is the holder node's czxid**: the zxid of the transaction that
created it, 64 bits with the leader's epoch in the high 32, so it strictly
increases across leader changes, and across the deletion of the scope's
container. It is read from the same transaction's ``setData`` of the tick
node (one transaction, one zxid). The sequence suffix is *not* a token: it
is the parent's signed 32-bit ``cversion``, which wraps, and which starts
from zero again when an emptied container parent is deleted and created anew.

TTLs: a node lives as long as the session that owns it. The client's own
deadline (``ttl_ms`` from the send time of the last answered request, K2) must
come before the server can expire the session and free the scope, so a
``ttl_ms`` above the negotiated session timeout is refused. A lease that is
not renewed by its deadline is deleted by its own client (recorded as
``lapsed``), and a session that expires ends every lease on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from stockade.core.errors import InvalidArgument
from stockade.core.limits import TTL_MS_MAX, validate_int, validate_scope

__all__ = [
    "SESSION_TIMEOUT_MS_DEFAULT", "SESSION_TIMEOUT_MS_MIN", "SESSION_TIMEOUT_MS_MAX", "HOSTS_MAX", "ROOT",
    "ZkLocation", "Layout", "parse_location", "check_ttl",
    "NODE_PREFIX", "sequence_of", "holder_value", "nonce_of", "holder_of", "last_value", "last_of", "lease_id_of",
    "parse_lease_id", "released_just_before",
]

ROOT = "/stockade"
SESSION_TIMEOUT_MS_DEFAULT = 10_000
SESSION_TIMEOUT_MS_MIN = 1_000
SESSION_TIMEOUT_MS_MAX = 600_000
HOSTS_MAX = 16
NODE_PREFIX = "n-"
DEFAULT_PORT = 2181
_CHROOT_RE = re.compile(r"(/[A-Za-z0-9._-]{1,100}){1,8}")
_SEQ_RE = re.compile(r"[0-9]{10}|-[0-9]{9}")


@dataclass(frozen=True, slots=True)
class ZkLocation:
    """A parsed ``zookeeper://`` url: kazoo's hosts string (chroot included) and the session timeout."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str
    session_timeout_ms: int

    @property
    def connect_string(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        return hosts + self.chroot


def parse_location(location: str) -> ZkLocation:
    """``h1:2181,h2:2181[/chroot][?session_timeout_ms=N]`` (the url after ``zookeeper://``).

    Raises:
        InvalidArgument: empty, too many hosts, a malformed ``host:port``, chroot or option.
    """
    if not isinstance(location, str) or not location or "@" in location:
        raise InvalidArgument("url", "zookeeper url needs servers: zookeeper://h1:2181,h2:2181,h3:2181[/chroot]")
    location, _, query = location.partition("?")
    hosts_text, slash, chroot = location.partition("/")
    chroot = ("/" + chroot.rstrip("/")) if slash and chroot.strip("/") else ""
    if chroot and not _CHROOT_RE.fullmatch(chroot) or any(step in (".", "..") for step in chroot.split("/")):
        raise InvalidArgument("url", "zookeeper chroot: 1..8 steps of 1..100 of [A-Za-z0-9._-]")
    hosts = []
    for part in hosts_text.split(","):
        host, sep, port_text = part.rpartition(":")
        if not sep or part.endswith("]"):
            host, port_text = part, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not host.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise InvalidArgument("url", f"bad zookeeper server {part!r}: want host:port")
        hosts.append((host, int(port_text)))
    if len(hosts) > HOSTS_MAX:
        raise InvalidArgument("url", f"at most {HOSTS_MAX} zookeeper servers")
    session_timeout_ms = SESSION_TIMEOUT_MS_DEFAULT
    for name, value in parse_qsl(query, keep_blank_values=True, max_num_fields=4) if query else []:
        if name != "session_timeout_ms" or not value.isdigit():
            raise InvalidArgument("url", f"unknown zookeeper option {name!r}: only session_timeout_ms=N")
        session_timeout_ms = validate_int("session_timeout_ms", int(value), SESSION_TIMEOUT_MS_MIN,
                                          SESSION_TIMEOUT_MS_MAX)
    return ZkLocation(tuple(hosts), chroot, session_timeout_ms)


def check_ttl(ttl_ms: int, session_timeout_ms: int) -> int:
    """``ttl_ms`` if a lease of it can be honoured on a session of ``session_timeout_ms`` (the negotiated one).

    Raises:
        InvalidArgument: outside stockade's TTL bounds, or above the session timeout
            (the server could free the scope before the client's own deadline).
    """
    validate_int("ttl_ms", ttl_ms, 1, TTL_MS_MAX)
    if ttl_ms > session_timeout_ms:
        raise InvalidArgument(
            "ttl_ms", f"{ttl_ms} is above the ZooKeeper session timeout ({session_timeout_ms} ms negotiated): "
                      "the server could free the scope before this client's deadline; use a shorter TTL "
                      "or ?session_timeout_ms= in the url")
    return ttl_ms


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one stockade cluster's nodes live: ``<chroot>/stockade`` (see the module docstring)."""

    root: str = ROOT

    @property
    def meta(self) -> str:
        return f"{self.root}/meta"

    @property
    def parents(self) -> tuple[str, ...]:
        return (self.meta, f"{self.root}/q", f"{self.root}/tick", f"{self.root}/last", self.hist_parent)

    def queue_path(self, scope: str) -> str:
        return f"{self.root}/q/{validate_scope(scope)}"

    def node_prefix(self, scope: str) -> str:
        return f"{self.queue_path(scope)}/{NODE_PREFIX}"

    def node_path(self, scope: str, sequence: str) -> str:
        return self.node_prefix(scope) + sequence

    def tick_path(self, scope: str) -> str:
        return f"{self.root}/tick/{validate_scope(scope)}"

    @property
    def tick_parent(self) -> str:
        return f"{self.root}/tick"

    def last_path(self, scope: str) -> str:
        return f"{self.root}/last/{validate_scope(scope)}"

    @property
    def hist_parent(self) -> str:
        return f"{self.root}/hist"

    def hist_path(self, scope: str) -> str:
        return f"{self.hist_parent}/{validate_scope(scope)}"


def sequence_of(name: str) -> int | None:
    """A queue node's sequence number (``n-0000000012`` -> 12); None for any other child.

    Queue order is this number's order. It is the parent's signed 32-bit
    ``cversion``: after 2**31 children of one container it wraps negative, which
    this order does not follow (docs/coordinator-zookeeper.md).
    """
    if not name.startswith(NODE_PREFIX) or not _SEQ_RE.fullmatch(name[len(NODE_PREFIX):]):
        return None
    return int(name[len(NODE_PREFIX):])


def holder_value(holder: str, ttl_ms: int, nonce: str) -> bytes:
    """A queue node's data: who queued it, its TTL, and the attempt's nonce (found again after a lost answer)."""
    return json.dumps({"holder": holder, "ttl_ms": ttl_ms, "nonce": nonce}).encode()


def nonce_of(data: bytes) -> str | None:
    try:
        return str(json.loads(data)["nonce"])
    except (ValueError, KeyError, TypeError):
        return None


def holder_of(data: bytes) -> tuple[str, int]:
    """What a queue node shows: its holder name and TTL (``?``, 0 when unreadable)."""
    try:
        shown = json.loads(data)
        return str(shown["holder"]), int(shown["ttl_ms"])
    except (ValueError, KeyError, TypeError):
        return "?", 0


def last_value(token: int, how: str, tick_version: int) -> bytes:
    return f"{token} {how} {tick_version}".encode()


def last_of(data: bytes | None) -> tuple[int, str, int]:
    """A ``last/<scope>`` record: (token, ``released``/``lapsed``, the tick version of its enqueue)."""
    fields = (data or b"").split()
    if len(fields) != 3 or not fields[0].isdigit() or not fields[2].isdigit():
        return 0, "", -1
    return int(fields[0]), fields[1].decode(errors="replace"), int(fields[2])


def released_just_before(last: bytes | None, tick_version: int) -> bool:
    """Whether the grant whose enqueue set the tick to ``tick_version`` follows a released holder.

    True when nobody was queued between the last recorded holder and this one
    (versions ``v`` and ``v + 1``) and that holder released the scope, or when
    this is the scope's first enqueue. Anything else (a lapse, an expired
    session, a waiter that left) may hide a lapse, and the lock-delay applies (C5).
    """
    if tick_version <= 1:
        return True
    _, how, version = last_of(last)
    return how == "released" and version + 1 == tick_version


def lease_id_of(token: int, sequence: str, scope: str) -> str:
    return f"{token}.{sequence}.{scope}"


def parse_lease_id(lease_id: object) -> tuple[int, str, str] | None:
    """``TOKEN.SEQUENCE.SCOPE`` (what a grant names its lease) as its parts; None for anything else."""
    if not isinstance(lease_id, str):
        return None
    token, _, rest = lease_id.partition(".")
    sequence, _, scope = rest.partition(".")
    if not (token.isdigit() and len(token) <= 20 and _SEQ_RE.fullmatch(sequence) and scope):
        return None
    try:
        return int(token), sequence, validate_scope(scope)
    except InvalidArgument:
        return None
