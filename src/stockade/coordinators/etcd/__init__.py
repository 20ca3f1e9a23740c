"""The etcd coordinator's recipe, sans-IO: key layout, TTL mapping, request bodies, answers.

The client's port (`stockade.coordinators.etcd._async.port`) sends these bodies to
etcd 3.4's JSON gateway (``/v3/...``, keys and values in base64) and reads the
answers with the parsers here. Everything under one prefix (``stockade/``)::

    stockade/meta/cluster        the stockade cluster id (16 hex), written once by txn
    stockade/meta/keyring        the keyring that signs tokens (written once, with the id)
    stockade/meta/incarnation    etcd's cluster id and raft-index-minus-revision gap (restore detection)
    stockade/meta/bump           the scratch key `stockade etcd bump-revision` writes to advance the revision
    stockade/q/<scope>/<lease>   a waiter or the holder, attached to its etcd lease
    stockade/last/<scope>        the last token issued for the scope (its fence floor)
    stockade/h/<scope>/<n>       the scope's lease history, event n (`stockade.coordinators.etcd._journal`)
    stockade/hn/<scope>          the history's head: the last event's n, and the lease it left open

The holder of a scope is the queue key with the lowest create revision; the
**token is that key's create revision**: cluster-wide and strictly
increasing, so per scope too. A waiter finds the key just before its own
(``max_create_revision``) and watches it, so a release wakes one waiter.

TTLs: etcd leases count whole seconds, and etcd raises any TTL below its
minimum (1.5 election timeouts: 2 s with the default 1 s election) to that
minimum. A lease of ``ttl_ms`` is an etcd lease of ``ceil(ttl_ms / 1000)``
seconds: the server never frees a scope before the client's own deadline
(``ttl_ms`` from the send time, K2) has passed, so the client always stops
first. What a client's lease cannot be is shorter than the server's; the
price is that a crashed holder's scope stays held up to ``max(ceil(ttl_ms /
1000), etcd's minimum)`` seconds. A TTL above `TTL_S_MAX` is refused.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from stockade.coordinators.etcd._journal import Head, ending, head_compare, journal_ops
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.limits import TTL_MS_MAX, validate_int, validate_scope

__all__ = [
    "PREFIX", "TTL_S_MAX", "MEMBERS_MAX", "EtcdMember", "Layout", "parse_location", "ttl_s_of", "b64", "unb64",
    "prefix_end", "KV", "kvs_of", "revision_of", "enqueue_txn", "predecessor_range", "waiter_read", "grant_txn",
    "cluster_txn",
    "last_token_of", "last_of", "release_txn", "GAP_SLACK", "BUMP_WRITES_MAX", "Incarnation", "incarnation_of",
    "marker_of", "marker_txn", "confirm_put", "bump_put", "restored_reason", "recordable",
]

PREFIX = b"stockade/"
#: etcd's own bound on a lease TTL (``MaxLeaseTTL``, seconds).
TTL_S_MAX = 9_000_000_000
MEMBERS_MAX = 16
DEFAULT_PORT = 2379
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class EtcdMember:
    host: str
    port: int


def parse_location(location: str) -> tuple[tuple[EtcdMember, ...], Layout]:
    """``h1:2379,h2:2379[/namespace]`` (the url after ``etcd://``): the members, in the order given,
    and the key layout (``stockade/`` or ``stockade/ns/<namespace>/``: one etcd may serve several
    stockade clusters, each with its own id, keyring and tokens' fence floors).

    Raises:
        InvalidArgument: empty, too many, a malformed ``host:port`` or namespace.
    """
    if not isinstance(location, str) or not location or "@" in location or "?" in location:
        raise InvalidArgument("url", "etcd url needs members: etcd://h1:2379,h2:2379,h3:2379[/namespace]")
    hosts, _, namespace = location.partition("/")
    namespace = namespace.rstrip("/")
    if namespace and (len(namespace) > 100 or not _NAMESPACE_RE.fullmatch(namespace)):
        raise InvalidArgument("url", "etcd namespace: 1..100 of [A-Za-z0-9._-]")
    members = []
    for part in hosts.split(","):
        host, sep, port_text = part.rpartition(":")
        if not sep:
            host, port_text = part, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not host.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise InvalidArgument("url", f"bad etcd member {part!r}: want host:port")
        members.append(EtcdMember(host, int(port_text)))
    if len(members) > MEMBERS_MAX:
        raise InvalidArgument("url", f"at most {MEMBERS_MAX} etcd members")
    return tuple(members), Layout(PREFIX + b"ns/" + namespace.encode() + b"/" if namespace else PREFIX)


def ttl_s_of(ttl_ms: int) -> int:
    """The etcd lease TTL for ``ttl_ms``: whole seconds, rounded up (never shorter than asked).

    Raises:
        InvalidArgument: outside stockade's TTL bounds, or above etcd's.
    """
    validate_int("ttl_ms", ttl_ms, 1, TTL_MS_MAX)
    seconds = -(-ttl_ms // 1000)
    if seconds > TTL_S_MAX:  # not reachable under TTL_MS_MAX today; kept if that bound grows
        raise InvalidArgument("ttl_ms", f"etcd leases last at most {TTL_S_MAX} s")
    return seconds


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one stockade cluster's keys live in etcd (see the module docstring)."""

    prefix: bytes = PREFIX

    @property
    def cluster_key(self) -> bytes:
        return self.prefix + b"meta/cluster"

    @property
    def keyring_key(self) -> bytes:
        return self.prefix + b"meta/keyring"

    @property
    def incarnation_key(self) -> bytes:
        return self.prefix + b"meta/incarnation"

    @property
    def bump_key(self) -> bytes:
        return self.prefix + b"meta/bump"

    @property
    def last_prefix(self) -> bytes:
        return self.prefix + b"last/"

    def queue_prefix(self, scope: str) -> bytes:
        return self.prefix + b"q/" + validate_scope(scope).encode() + b"/"

    def queue_key(self, scope: str, lease: int) -> bytes:
        return self.queue_prefix(scope) + f"{lease:016x}".encode()

    def last_key(self, scope: str) -> bytes:
        return self.last_prefix + validate_scope(scope).encode()

    def scope_of_last_key(self, key: bytes) -> str:
        return key[len(self.last_prefix):].decode()

    @property
    def journal_root(self) -> bytes:
        """Every scope's history events (the global cap counts this range)."""
        return self.prefix + b"h/"

    def journal_prefix(self, scope: str) -> bytes:
        return self.journal_root + validate_scope(scope).encode() + b"/"

    def journal_key(self, scope: str, n: int) -> bytes:
        return self.journal_prefix(scope) + f"{n:016x}".encode()

    def head_key(self, scope: str) -> bytes:
        return self.prefix + b"hn/" + validate_scope(scope).encode()


@dataclass(frozen=True, slots=True)
class KV:
    """One key as etcd's gateway shows it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def kvs_of(range_response: dict[str, Any]) -> list[KV]:
    """The keys of a range answer (``kvs`` is absent when empty)."""
    try:
        return [
            KV(unb64(kv["key"]), unb64(kv.get("value", "")), int(kv.get("create_revision", 0)),
               int(kv.get("mod_revision", 0)), int(kv.get("lease", 0)))
            for kv in range_response.get("kvs", [])
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendUnavailable(f"etcd answered a range that is not one: {exc}") from None


def revision_of(answer: dict[str, Any]) -> int:
    try:
        return int(answer["header"]["revision"])
    except (KeyError, TypeError, ValueError):
        raise BackendUnavailable("etcd answered without a header revision") from None


def _range(key: bytes, end: bytes | None = None, **options: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), **options}
    if end is not None:
        request["range_end"] = b64(end)
    return {"request_range": request}


def enqueue_txn(layout: Layout, scope: str, lease: int, holder: str, ttl_ms: int, *, head: Head,
                at_unix_ms: int) -> tuple[dict[str, Any], Head]:
    """Put this attempt's queue key; if the queue was empty, mark the grant in the same revision.

    ``compare`` over the whole queue range holds when no key there exists (an
    empty range compares as create revision 0), so an uncontended acquire is
    one round trip: the key, ``last/<scope>`` and the history's ``grant`` (after
    the ``expire`` of a lease ``head`` leaves open: its key is gone) share one
    revision, the token. The Txn also compares the history's head with
    ``head``: when it moved, the failure branch runs, and the caller goes the
    waiter's way (`grant_txn`) with the head read back.

    Success reads: ``[0]`` the previous ``last/<scope>``, ``[3]`` the key.
    Failure reads: ``[1]`` the key (a retried put keeps its first create revision), ``[2]`` the head.

    Returns:
        The body, and the head it writes if it succeeds (`_etcd_journal.settled` with its revision).
    """
    key = layout.queue_key(scope, lease)
    value = json.dumps({"holder": holder, "ttl_ms": ttl_ms}).encode()
    put = {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}
    end = prefix_end(layout.queue_prefix(scope))
    journal, after = journal_ops(layout, scope, head, [*ending(head, 0), ("grant", holder, 0)], opens=(0, holder),
                                 at_unix_ms=at_unix_ms)
    return {
        "compare": [{"key": b64(layout.queue_prefix(scope)), "range_end": b64(end), "target": "CREATE",
                     "result": "EQUAL", "create_revision": "0"}, *head_compare(b64(layout.head_key(scope)), head)],
        "success": [_range(layout.last_key(scope)), put, {"request_put": {"key": b64(layout.last_key(scope)),
                                                                           "value": ""}}, _range(key), *journal],
        "failure": [put, _range(key), _range(layout.head_key(scope))],
    }, after


def predecessor_range(layout: Layout, scope: str, create_revision: int) -> dict[str, Any]:
    """The queue key created just before ``create_revision`` (or none: the caller is first)."""
    return {
        "key": b64(layout.queue_prefix(scope)), "range_end": b64(prefix_end(layout.queue_prefix(scope))),
        "max_create_revision": str(create_revision - 1), "sort_order": "DESCEND", "sort_target": "CREATE",
        "limit": "1", "keys_only": True,
    }


def waiter_read(layout: Layout, scope: str, create_revision: int) -> dict[str, Any]:
    """A read-only Txn (no raft entry): ``[0]`` the key before ``create_revision``, ``[1]`` the history's head."""
    return {"success": [{"request_range": predecessor_range(layout, scope, create_revision)},
                        _range(layout.head_key(scope))]}


def grant_txn(layout: Layout, scope: str, lease: int, create_revision: int, *, holder: str, head: Head,
              at_unix_ms: int) -> tuple[dict[str, Any], Head]:
    """First in the queue: record the token as the scope's last, if the key is still ours (alive).

    The success branch reads the previous ``last/<scope>`` first (``[0]``): was its
    holder's lease released or did it lapse (`last_of`)? A lapse starts the
    lock-delay (C5). The history gets the ``expire`` of a lease ``head`` leaves
    open (its key, created before this one, is gone) and this ``grant``, in the
    same revision. The failure branch reads ``[0]`` the key, ``[1]`` the head:
    a head that moved is retried; a key that is gone is a lease that expired.

    Returns:
        The body, and the head it writes if it succeeds.
    """
    key = layout.queue_key(scope, lease)
    journal, after = journal_ops(layout, scope, head, [*ending(head, create_revision),
                                                       ("grant", holder, create_revision)],
                                 opens=(create_revision, holder), at_unix_ms=at_unix_ms)
    return {
        "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(create_revision)},
                    *head_compare(b64(layout.head_key(scope)), head)],
        "success": [_range(layout.last_key(scope)),
                    {"request_put": {"key": b64(layout.last_key(scope)), "value": b64(str(create_revision).encode())}},
                    *journal],
        "failure": [_range(key), _range(layout.head_key(scope))],
    }, after


def release_txn(layout: Layout, scope: str, lease: int, token: int, *, holder: str, head: Head,
                at_unix_ms: int) -> tuple[dict[str, Any], Head]:
    """Give the scope up: delete the holder's key, mark its token released and journal the
    ``release``, in one revision.

    A holder key that vanishes *without* this mark lapsed (its lease expired or was
    revoked), which is what the lock-delay (C5) waits after. The failure branch reads
    ``[0]`` the key (gone: not held, nothing written), ``[1]`` the head (moved: retry).

    Returns:
        The body, and the head it writes if it succeeds.
    """
    key = layout.queue_key(scope, lease)
    journal, after = journal_ops(layout, scope, head, [*ending(head, token), ("release", holder, token)],
                                 opens=None, at_unix_ms=at_unix_ms)
    return {
        "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(token)},
                    *head_compare(b64(layout.head_key(scope)), head)],
        "success": [{"request_delete_range": {"key": b64(key)}},
                    {"request_put": {"key": b64(layout.last_key(scope)), "value": b64(f"{token} released".encode())}},
                    *journal],
        "failure": [_range(key), _range(layout.head_key(scope))],
    }, after


def last_of(kv: KV | None) -> tuple[int, bool]:
    """A ``last/<scope>`` key's token, and whether its holder released it.

    The value is the token (``""``: written by `enqueue_txn`, the key's own
    revision), followed by `` released`` once `release_txn` ran.
    """
    if kv is None:
        return 0, True
    fields = kv.value.split()
    return (int(fields[0]) if fields else kv.mod_revision), fields[1:] == [b"released"]


def last_token_of(kv: KV | None) -> int:
    """A ``last/<scope>`` key's token (0: none)."""
    return last_of(kv)[0]


def cluster_txn(layout: Layout, cluster_id: str, keyring: bytes) -> dict[str, Any]:
    """Write the cluster id and keyring once; either way, read back what is stored."""
    reads = [_range(layout.cluster_key), _range(layout.keyring_key)]
    return {
        "compare": [{"key": b64(layout.cluster_key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": b64(layout.cluster_key), "value": b64(cluster_id.encode())}},
                    {"request_put": {"key": b64(layout.keyring_key), "value": b64(keyring)}}, *reads],
        "failure": reads,
    }



# -- restores: telling a restored etcd apart without having seen it before ---------------------------

#: How far below the recorded gap a measured one may read before it means a restore. A member
#: may apply an entry's revision a moment before its applied index (one entry), and a status
#: is two reads; never seen below the recorded gap on a loaded cluster.
GAP_SLACK = 2
#: The most writes `stockade etcd bump-revision` makes (each advances the revision by one).
BUMP_WRITES_MAX = 10_000_000


@dataclass(frozen=True, slots=True)
class Incarnation:
    """What a member's status says of the cluster's history.

    Attributes:
        etcd_cluster: etcd's own cluster id (from its member list and cluster token).
        gap: the raft applied index minus the revision. Every raft entry raises the
            index by one and the revision by at most one, so within one cluster's life
            the gap never goes down; ``etcdctl snapshot restore`` starts a new raft log
            (index ~ 2 x members) at the snapshot's revision, so the gap drops by about
            the old index.
        revision: the member's revision when it answered.
    """

    etcd_cluster: str
    gap: int
    revision: int


def incarnation_of(status: dict[str, Any]) -> Incarnation:
    """A ``/v3/maintenance/status`` answer's incarnation (etcd 3.4+: ``raftAppliedIndex``)."""
    try:
        header = status["header"]
        applied = int(status.get("raftAppliedIndex") or status["raftIndex"])
        revision = int(header["revision"])
        return Incarnation(str(int(header["cluster_id"])), applied - revision, revision)
    except (KeyError, TypeError, ValueError):
        raise BackendUnavailable("etcd answered a status without its raft index, revision or cluster id") from None


def recordable(now: Incarnation) -> Incarnation:
    """``now`` as it is recorded: its gap lowered by `GAP_SLACK`, since one status may read it a little high
    (an entry applied between its two reads) and a later one a little low."""
    return Incarnation(now.etcd_cluster, now.gap - GAP_SLACK, now.revision)


def marker_of(kv: KV | None) -> Incarnation | None:
    """The incarnation recorded in ``meta/incarnation`` (None: none recorded)."""
    if kv is None:
        return None
    try:
        shown = json.loads(kv.value)
        return Incarnation(str(shown["etcd_cluster"]), int(shown["gap"]), int(shown["revision"]))
    except (ValueError, KeyError, TypeError):
        raise BackendUnavailable("etcd holds a stockade incarnation marker that is not one") from None


def _marker_value(incarnation: Incarnation) -> bytes:
    return json.dumps({"etcd_cluster": incarnation.etcd_cluster, "gap": incarnation.gap,
                       "revision": incarnation.revision}).encode()


def marker_txn(layout: Layout, incarnation: Incarnation) -> dict[str, Any]:
    """Record ``incarnation`` if no marker is recorded yet; either way, read back what is stored."""
    key = layout.incarnation_key
    return {
        "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": b64(key), "value": b64(_marker_value(incarnation))}}, _range(key)],
        "failure": [_range(key)],
    }


def confirm_put(layout: Layout, incarnation: Incarnation) -> dict[str, Any]:
    """The put that records ``incarnation`` as the cluster's own (after a restore's revision bump)."""
    return {"key": b64(layout.incarnation_key), "value": b64(_marker_value(incarnation))}


def bump_put(layout: Layout) -> dict[str, Any]:
    """One write that advances the revision by one (the scratch key holds nothing that matters)."""
    return {"key": b64(layout.bump_key), "value": ""}


def restored_reason(marker: Incarnation | None, now: Incarnation) -> str | None:
    """Why ``now`` cannot be the cluster ``marker`` was recorded on (None: nothing says it was restored).

    A restore is certain when etcd's cluster id changed (restored under another
    cluster token or other peer urls) or when the gap fell by more than `GAP_SLACK`.
    It goes unseen when the restored cluster has since applied more raft entries
    that write nothing (lease grants, failed compares) than it lost by the restore:
    stockade's clients write none while they refuse.
    """
    if marker is None:
        return None
    if now.etcd_cluster != marker.etcd_cluster:
        return f"etcd's cluster id changed from {marker.etcd_cluster} to {now.etcd_cluster}"
    if now.gap < marker.gap - GAP_SLACK:
        return (f"etcd's raft log restarted behind its revision (raft index minus revision {now.gap}, "
                f"recorded {marker.gap})")
    return None
