"""The etcd coordinator's lease history, sans-IO: journal keys written in the Txn of each change.

Two kinds of key per scope, under the cluster's prefix (docs/history.md, "On etcd")::

    stockade/h/<scope>/<n>       event n of the scope (n = 1, 2, ...; 16 hex digits, so keys sort as n)
    stockade/hn/<scope>          the journal's head: n of the last event, and the lease it left open

A grant's Txn (`stockade.coordinators.etcd.enqueue_txn` or ``grant_txn``) and a
release's (``release_txn``) put their events and the new head beside the
change, and delete the event that falls out of the last `HISTORY_PER_SCOPE`:
the head says which (``n - 100``), so no read is needed. Each of those Txns
*compares* the head with the one the client last saw (its mod revision and
its value): a stale guess fails the whole Txn, nothing is written, and the
client retries with the head the failure branch read back.

An expiry is etcd's own deletion of the holder key, not a Txn of ours: the
head still names the lease as open, and the next grant's Txn, which can only
succeed once that key is gone, writes the ``expire`` before its ``grant``.

Order: an event's ``seq`` is ``10 x`` the revision of the Txn that wrote it
(its key's mod revision) plus its place in that Txn (0 or 1): it never goes
back, and is never shared. Times are the writer's wall clock: etcd keeps no
clock a client can read.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from stockade.coordinators.journal import HISTORY_PER_SCOPE, EventKind, HistoryEvent
from stockade.core.errors import BackendUnavailable

__all__ = [
    "Head", "head_of", "head_compare", "journal_ops", "settled", "ending", "released_before", "events_of_range",
    "SEQ_PER_REVISION", "SWEEP_DELETES_MAX", "SWEEP_OPS_PER_TXN", "Pending",
]

#: ``seq = revision * SEQ_PER_REVISION + place``: at most two events share a Txn (an expire, then a grant).
SEQ_PER_REVISION = 10
#: The most old events one sweep of the global cap deletes, and the deletes per Txn (etcd allows 128 ops).
SWEEP_DELETES_MAX = 10_000
SWEEP_OPS_PER_TXN = 100
#: The token of an event written in the Txn that creates the holder key: that Txn's revision (not known
#: when the Txn is sent), read back as the event key's mod revision.
_SELF = "self"

#: One event to journal: (kind, holder, token value; 0 = the Txn's own revision).
Pending = tuple[EventKind, str, int]


@dataclass(frozen=True, slots=True)
class Head:
    """A scope's journal head, as a client last saw it.

    Attributes:
        n: the number of the last event (0: none yet).
        open_token: the token of the lease the last event left open (its grant), 0 when none.
        open_holder: that lease's holder.
        mod_revision: the head key's mod revision (0: no head key).
        raw: the head key's value, exactly as stored (compared by the next Txn).
    """

    n: int = 0
    open_token: int = 0
    open_holder: str = ""
    mod_revision: int = 0
    raw: bytes = b""


def head_of(kv: Any) -> Head:
    """The head a ``hn/<scope>`` key holds (`stockade.coordinators.etcd.KV`; None: no head yet)."""
    if kv is None:
        return Head()
    try:
        shown = json.loads(kv.value)
        token = shown["open"]
        open_token = kv.mod_revision if token == _SELF else int(token)  # 0: no lease open
        return Head(int(shown["n"]), open_token, str(shown["holder"]), kv.mod_revision, kv.value)
    except (ValueError, KeyError, TypeError):
        raise BackendUnavailable("etcd holds a stockade history head that is not one") from None


def head_compare(key_b64: str, head: Head) -> list[dict[str, Any]]:
    """Compares that hold only while the head is still ``head`` (absent, when ``head`` says none)."""
    if not head.mod_revision:
        return [{"key": key_b64, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
    return [{"key": key_b64, "target": "MOD", "result": "EQUAL", "mod_revision": str(head.mod_revision)},
            {"key": key_b64, "target": "VALUE", "result": "EQUAL", "value": _b64(head.raw)}]


def journal_ops(
    layout: Any, scope: str, head: Head, events: list[Pending], *, opens: tuple[int, str] | None, at_unix_ms: int
) -> tuple[list[dict[str, Any]], Head]:
    """The puts and deletes that journal ``events`` after ``head``, and the head they leave.

    Args:
        layout: the `stockade.coordinators.etcd.Layout`.
        events: in order; a token of 0 is the Txn's own revision (a grant in the Txn that creates its key).
        opens: the lease left open afterwards (token, 0 as above; holder), or None.
        at_unix_ms: the writer's wall clock.

    Returns:
        The ops (to append to the change's branch) and the head they write; its
        ``mod_revision`` (and an ``open_token`` of 0) are filled in from the Txn's answer
        by `Head` users (`settled`).
    """
    ops: list[dict[str, Any]] = []
    n = head.n
    for place, (kind, holder, token) in enumerate(events):
        n += 1
        value = {"kind": kind, "holder": holder, "token": token or _SELF, "at_unix_ms": at_unix_ms, "place": place}
        ops.append({"request_put": {"key": _b64(layout.journal_key(scope, n)),
                                    "value": _b64(json.dumps(value).encode())}})
        if n > HISTORY_PER_SCOPE:  # the one that falls out of the window, known from the head alone
            ops.append({"request_delete_range": {"key": _b64(layout.journal_key(scope, n - HISTORY_PER_SCOPE))}})
    token, holder = opens if opens is not None else (0, "")
    shown_open: int | str = (token or _SELF) if opens is not None else 0
    raw = json.dumps({"n": n, "open": shown_open, "holder": holder}).encode()
    ops.append({"request_put": {"key": _b64(layout.head_key(scope)), "value": _b64(raw)}})
    return ops, Head(n, token, holder, 0, raw)


def settled(head: Head, revision: int) -> Head:
    """``head`` (from `journal_ops`) as written by the Txn of ``revision``."""
    open_token = head.open_token or (revision if head.open_holder else 0)
    return Head(head.n, open_token, head.open_holder, revision, head.raw)


def ending(head: Head, token: int) -> list[Pending]:
    """The ``expire`` of the lease ``head`` leaves open, unless it is ``token`` or none.

    Only a Txn that has seen that lease's key gone calls this (a grant first in its
    queue; a release of a later lease): it ended without a release, so it lapsed (etcd
    expired or revoked its lease).
    """
    if head.open_token and head.open_token != token:
        return [("expire", head.open_holder, head.open_token)]
    return []


def released_before(events: list[HistoryEvent], token: int) -> bool:
    """Whether a scope's last ``events`` show the lease before the grant of ``token`` released (not lapsed).

    For a grant whose own answer was lost: its Txn overwrote ``last/<scope>``, which
    told a release from a lapse, but it journaled the ``expire`` of a lapsed
    predecessor in its own revision, and a release was journaled by the release
    itself. Only a ``release`` right before this grant counts; no predecessor in
    the journal (trimmed, or a scope used before it kept history) is not known.
    """
    return (len(events) >= 2 and events[-1].kind == "grant" and events[-1].token_value == token
            and events[-2].kind == "release" and events[-2].token_value < token)


def events_of_range(scope: str, kvs: list[Any]) -> list[HistoryEvent]:
    """The events of a range over ``h/<scope>/``, oldest first (whatever order the range had)."""
    events = []
    try:
        for kv in kvs:
            shown = json.loads(kv.value)
            token = kv.mod_revision if shown["token"] == _SELF else int(shown["token"])
            events.append(HistoryEvent(kv.mod_revision * SEQ_PER_REVISION + int(shown["place"]), scope,
                                       shown["kind"], str(shown["holder"]), token, int(shown["at_unix_ms"])))
    except (ValueError, KeyError, TypeError):
        raise BackendUnavailable("etcd holds a stockade history event that is not one") from None
    return sorted(events, key=lambda event: event.seq)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
