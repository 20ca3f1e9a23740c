"""What the dashboard shows: one page of scopes, busiest first, with the server's health (docs/dashboard.md).

A `View` is what one viewer asked for (a filter, a page) and may see (its
token's scope patterns). `snapshot` turns it into one JSON document, the same
for the first answer and for every event of the stream:

- the scopes, busiest first (most waiters, then held, then most grants ever:
  the last token issued), `PAGE_SCOPES` a page, at most `PAGES_MAX` pages; each
  with its holder, its token's value (never its MAC, never its lease id), the
  time left on its lease, its waiters' holder names in queue order (from a
  backend, `--coordinator` or ``stockade ui``: its contenders, the first
  `QUEUE_SHOWN_MAX` of them), the time
  left of its lock-delay (C5), and the high-water mark the store knows (R1);
- fence rejections by reason and the server's health (connections, leases,
  waiters, open dashboard streams, group-commit latency), only to a viewer
  whose token covers every scope (they are what ``/metrics`` shows, and a
  scope-limited token is refused ``/metrics``).

Cost: ranking is one pass over the scopes the viewer may see (`heapq.nlargest`
keeps ``page x PAGE_SCOPES`` of them), so a page of 100,000 scopes costs one
pass and 50 rows, whatever the page; over a backend (``--coordinator``, ``stockade
ui``) the scopes are listed from it, the first `SCAN_SCOPES_MAX` of them in name
order. A scope's page (``?scope=NAME``) is one lookup either way: its record in
the table, or one `inspect` of that scope on the backend (found however many
scopes come before it in name order; a scope never granted and with no waiter
has no row).
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stockade import metrics
from stockade.core.errors import InvalidArgument
from stockade.core.leases import ScopeInfo, ScopeRecord, describe
from stockade.core.limits import LIST_PAGE_MAX, validate_scope
from stockade.resources._observe import REASONS
from stockade.server import _metrics
from stockade.server._leases import LeaseService

__all__ = ["View", "PAGE_SCOPES", "PAGES_MAX", "FILTER_CHARS_MAX", "SCAN_SCOPES_MAX", "view_of", "snapshot",
           "stable_part", "Latency"]

PAGE_SCOPES = 50
#: Contenders read for a waiting scope of a page served from a backend (``--coordinator``, ``stockade ui``):
#: its holder and the first waiters (the server's own lease table shows every waiter).
QUEUE_SHOWN_MAX = 101
PAGES_MAX = 200  # the busiest 10,000 scopes can be paged through; the filter box finds the others
FILTER_CHARS_MAX = 200  # a scope is at most 200 bytes
SCAN_SCOPES_MAX = 10_000  # scopes listed from a --coordinator backend per snapshot
LATENCY_WINDOW_S = 10.0  # commit latency is shown over about this many seconds
_NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class View:
    """What one viewer asked for and may see. ``patterns`` None: every scope, and the server's health."""

    patterns: tuple[str, ...] | None
    text: str = ""
    page: int = 0
    exact: bool = False  # ``text`` is one scope's whole name (a scope's page), not a part of names

    def sees(self, scope: str) -> bool:
        if self.text and (scope != self.text if self.exact else self.text not in scope):
            return False
        if self.patterns is None:
            return True
        prefixes, names = _split(self.patterns)  # `scope_allowed`, with one C call per scope: 100,000 in ~0.1 s
        return scope.startswith(prefixes) or scope in names


@functools.lru_cache(maxsize=256)
def _split(patterns: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """A token's scope patterns as (prefixes of the ``*`` ones, whole names): what `scope_allowed` tests."""
    return tuple(p[:-1] for p in patterns if p.endswith("*")), frozenset(p for p in patterns if not p.endswith("*"))


def view_of(params: dict[str, str], patterns: tuple[str, ...] | None) -> View:
    """The view a query asks for: ``q`` (a substring of scope names) and ``page`` (from 0), or ``scope`` (one
    scope by its whole name, what a scope's page shows, however many scopes contain its name).

    Raises:
        InvalidArgument: a filter too long or not printable, a page out of 0..PAGES_MAX-1, or ``scope`` not a
            scope name or with ``q`` or ``page``.
    """
    if "scope" in params:
        if len(params) > 1:
            raise InvalidArgument("scope", "goes alone, without q or page")
        return View(patterns, validate_scope(params["scope"]), 0, exact=True)
    text = params.get("q", "")
    if len(text) > FILTER_CHARS_MAX or not text.isprintable():
        raise InvalidArgument("q", f"at most {FILTER_CHARS_MAX} printable characters")
    raw = params.get("page", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 4 or not 0 <= int(raw) < PAGES_MAX:
        raise InvalidArgument("page", f"must be an integer in 0..{PAGES_MAX - 1}")
    return View(patterns, text, int(raw))


class Latency:
    """The group commits' latency over the last `LATENCY_WINDOW_S` (from `_metrics.COMMIT_SECONDS`)."""

    def __init__(self) -> None:
        self._marks: list[tuple[float, list[float], float]] = []  # (when, counts, sum), oldest first

    def read(self, file: str) -> dict[str, Any]:
        now = time.monotonic()
        counts, total = _metrics.COMMIT_SECONDS.series(file)
        self._marks.append((now, counts, total))
        while len(self._marks) > 2 and self._marks[1][0] <= now - LATENCY_WINDOW_S:
            self._marks.pop(0)
        _, old_counts, old_total = self._marks[0]
        if len(self._marks) == 1:
            old_counts, old_total = [0.0] * len(counts), 0.0
        delta = [new - old for new, old in zip(counts, old_counts, strict=True)]
        commits = int(sum(delta))
        if not commits:
            return {"commits": 0, "mean_ms": None, "p99_ms": None}
        return {"commits": commits, "mean_ms": round((total - old_total) * 1000 / commits, 3),
                "p99_ms": _quantile(delta, 0.99)}


def _quantile(counts: Sequence[float], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding quantile ``q``; None past the last bound."""
    wanted, seen = q * sum(counts), 0.0
    for bound, count in zip(_metrics.COMMIT_SECONDS.buckets, counts, strict=False):
        seen += count
        if seen >= wanted:
            return bound * 1000
    return None


def _busy(record: ScopeRecord, now_ns: int) -> tuple[int, bool, int]:
    lease = record.lease
    return len(record.waiters), lease is not None and lease.expires_ns > now_ns, record.last_token


def _ranked(records: Mapping[str, ScopeRecord], view: View, now_ns: int) -> tuple[list[ScopeRecord], int]:
    """The view's page of records, busiest first, and how many records the view sees."""
    if view.exact:  # a scope's page: one lookup, not a pass
        record = records.get(view.text)
        found = [record] if record is not None and view.sees(record.scope) else []
        return found, len(found)
    wanted = (view.page + 1) * PAGE_SCOPES
    if not view.text and view.patterns is None:  # sees every scope: no test per scope
        top = heapq.nlargest(wanted, records.values(), key=lambda r: _busy(r, now_ns))
        return top[view.page * PAGE_SCOPES:], len(records)
    seen = 0

    def visible() -> Iterable[ScopeRecord]:
        nonlocal seen
        for name, record in records.items():
            if view.sees(name):
                seen += 1
                yield record

    top = heapq.nlargest(wanted, visible(), key=lambda r: _busy(r, now_ns))
    return top[view.page * PAGE_SCOPES:], seen


def _row(info: ScopeInfo, queue: list[str] | None, delay_ms: int, high_water: int) -> dict[str, Any]:
    # Token values and marks go as decimal strings: they reach 2**63 - 1, past a JavaScript number's exact range.
    return {"scope": info.scope, "state": info.state.value, "holder": info.holder,
            "token": str(info.token.value) if info.token else None, "last_token": str(info.last_token),
            "remaining_ms": info.remaining_ms if info.token else None, "waiters": info.waiters, "queue": queue,
            "delay_ms": delay_ms, "high_water": str(high_water)}


async def _rows(leases: Any, store: Any, view: View) -> tuple[list[dict[str, Any]], int, bool]:
    """``(rows, scopes the view sees, exact)``: from the table in memory, or listed from a backend."""
    if isinstance(leases, LeaseService):  # the server's own coordinator: its lease table in memory
        now_ns = leases.clock.now_ns()
        busiest, seen = _ranked(leases.records, view, now_ns)
        rows = [_row(describe(r, now_ns, leases.policy), [w.holder for w in r.waiters],
                     max(0, (r.delay_until_ns - now_ns) // _NS_PER_MS), store.high_water(r.scope)) for r in busiest]
        return rows, seen, True
    if view.exact:  # a scope's page: one read of that scope on the backend, not a listing
        rows = await _scope_row(leases, store, view)
        return rows, len(rows), True
    infos: list[ScopeInfo] = []
    after, scanned = "", 0
    while scanned < SCAN_SCOPES_MAX:
        batch, after_next = await leases.list(after=after, limit=min(LIST_PAGE_MAX, SCAN_SCOPES_MAX - scanned))
        scanned += len(batch)
        infos.extend(i for i in batch if view.sees(i.scope))
        if after_next is None:
            break
        after = after_next
    exact = scanned < SCAN_SCOPES_MAX
    infos.sort(key=lambda i: (i.waiters, i.token is not None, i.last_token), reverse=True)
    page = infos[view.page * PAGE_SCOPES:(view.page + 1) * PAGE_SCOPES]
    return [await _backend_row(leases, store, info) for info in page], len(infos), exact


async def _scope_row(leases: Any, store: Any, view: View) -> list[dict[str, Any]]:
    """The row of the one scope an exact view names, read by name from the backend (`inspect`), if the
    viewer may see it (the same rule as a listing) and it is recorded (granted once, or waited for)."""
    if not view.sees(view.text):
        return []
    info = await leases.inspect(view.text)
    if info is None or (info.token is None and not info.last_token and not info.waiters):
        return []
    return [await _backend_row(leases, store, info)]


async def _backend_row(leases: Any, store: Any, info: ScopeInfo) -> dict[str, Any]:
    """A backend scope's row; a waiting scope's queue read from the backend's own line (its contenders)."""
    queue = None
    if info.waiters:
        queue = [c.holder for c in await leases.contenders(info.scope, QUEUE_SHOWN_MAX) if not c.holding]
    return _row(info, queue, 0, store.high_water(info.scope))


async def snapshot(leases: Any, store: Any, view: View, *, cluster: str, lock_delay_ms: int | None,
                   health: dict[str, Any] | None) -> dict[str, Any]:
    """The document the page draws: see the module docstring. ``health`` None: not shown to this view."""
    rows, seen, exact = await _rows(leases, store, view)
    document: dict[str, Any] = {
        "cluster": cluster, "q": view.text, "page": view.page, "page_scopes": PAGE_SCOPES,
        "pages": min(PAGES_MAX, max(1, -(-seen // PAGE_SCOPES))), "scopes_seen": seen, "exact": exact,
        "lock_delay_ms": lock_delay_ms,
        "scopes": rows, "limited": view.patterns is not None,
    }
    if view.patterns is None and health is not None:
        document["rejections"] = {reason: int(metrics.FENCE_REJECTIONS.value(reason=reason)) for reason in REASONS}
        document["health"] = health
    return document


def stable_part(document: dict[str, Any]) -> Any:
    """The document without what changes by itself as time passes (time left): equal means nothing happened."""
    rows = [{k: v for k, v in row.items() if k not in ("remaining_ms", "delay_ms")} for row in document["scopes"]]
    rest = {k: v for k, v in document.items() if k not in ("scopes", "health")}
    health = {k: v for k, v in (document.get("health") or {}).items() if k != "commit"}
    return rows, rest, health
