"""A scope's timeline as HTML: leases as bars, refused writes as marks, and the events as a table.

Drawn from the coordinator's journal (grants, releases, expiries: docs/history.md)
and the store's journal of refused writes (each with the refused token and the
mark that refused it), merged in time order, as ``stockade history`` merges them.
`render_timeline` gives a fragment (no ``<html>``): the dashboard's scope page
(``/ui/scope/NAME``) puts it in its layout and fetches it again when the scope
changes. It has no script and no style of its own (the classes are styled by
``static/dashboard.css``, and the page's Content-Security-Policy allows no
inline style). It is the dashboard's own: this branch had no shared timeline
renderer to use (docs/dashboard.md).

Every text is escaped; no lease id is in a journal, and a token shows as its
value (the journals keep no MAC).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from stockade.core.journal import HistoryEvent

__all__ = ["render_timeline", "WIDTH_PX"]

WIDTH_PX = 1200
_LANE_PX = 22
_TOP_PX = 18


def _when(at_unix_ms: int) -> str:
    seconds, ms = divmod(at_unix_ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def _spans(events: Sequence[HistoryEvent]) -> list[tuple[HistoryEvent, HistoryEvent | None]]:
    """Each grant and the release or expiry that ended it (None: still open at the last event)."""
    spans: list[tuple[HistoryEvent, HistoryEvent | None]] = []
    open_grants: dict[int, int] = {}  # token value -> index in spans
    for event in events:
        if event.kind == "grant":
            open_grants[event.token_value] = len(spans)
            spans.append((event, None))
        elif event.kind in ("release", "expire") and event.token_value in open_grants:
            index = open_grants.pop(event.token_value)
            spans[index] = (spans[index][0], event)
    return spans


def _what(event: HistoryEvent) -> str:
    if event.kind == "reject":
        return f"token {event.token_value} refused ({event.detail})"
    return f"token {event.token_value}, holder {event.holder}"


def render_timeline(scope: str, events: Sequence[tuple[HistoryEvent, str]], *, now_unix_ms: int) -> str:
    """The timeline of ``scope``: ``events`` are ``(event, source)`` pairs, source ``coordinator`` or ``store``.

    The axis runs from the first event to ``now_unix_ms`` (a lease still open
    is drawn up to now), on the clock that wrote the journals.
    """
    ordered = sorted(events, key=lambda pair: (pair[0].at_unix_ms, pair[1] == "store", pair[0].seq))
    if not ordered:
        return f'<p class="empty">No events recorded for {html.escape(scope)}.</p>'
    start, end = ordered[0][0].at_unix_ms, max(now_unix_ms, ordered[-1][0].at_unix_ms)
    span_ms = max(1, end - start)

    def x(at_unix_ms: int) -> float:
        return round(8 + (WIDTH_PX - 16) * (at_unix_ms - start) / span_ms, 1)

    plain = [event for event, _ in ordered]
    leases = _spans(plain)
    rejections = [event for event in plain if event.kind == "reject"]
    height = _TOP_PX + _LANE_PX * 2 + 18
    parts = [f'<svg class="timeline" viewBox="0 0 {WIDTH_PX} {height}" role="img" '
             f'aria-label="timeline of {html.escape(scope)}">',
             f'<text class="axis" x="8" y="12">{html.escape(_when(start))}</text>',
             f'<text class="axis" x="{WIDTH_PX - 8}" y="12" text-anchor="end">{html.escape(_when(end))}</text>']
    for grant, ended in leases:
        left = x(grant.at_unix_ms)
        right = x(ended.at_unix_ms) if ended is not None else WIDTH_PX - 8
        kind = "open" if ended is None else ended.kind
        parts.append(f'<g class="lease {kind}"><title>{html.escape(_what(grant))}: {kind}</title>'
                     f'<rect x="{left}" y="{_TOP_PX}" width="{max(3.0, right - left)}" height="{_LANE_PX - 4}" rx="3"/>'
                     f'<text x="{left + 3}" y="{_TOP_PX + 13}">{grant.token_value} {html.escape(grant.holder)}'
                     '</text></g>')
    lane = _TOP_PX + _LANE_PX
    for event in rejections:
        at = x(event.at_unix_ms)
        label = (f'x="{at + 8}"' if at < WIDTH_PX / 2 else f'x="{at - 8}" text-anchor="end"')  # stays inside
        parts.append(f'<g class="reject"><title>{html.escape(_what(event))}</title>'
                     f'<path d="M{at} {lane} l6 {_LANE_PX - 4} h-12 z"/>'
                     f'<text {label} y="{lane + 13}">refused {event.token_value}</text></g>')
    parts.append(f'<text class="axis" x="8" y="{height - 4}">leases (their token) above; refused writes (the '
                 'refused token) below; hover for details</text></svg>')
    rows = "".join(
        f'<tr class="{event.kind}"><td>{html.escape(_when(event.at_unix_ms))}<td><span class="kind">{event.kind}'
        f'</span><td class="num">{event.token_value}<td>{html.escape(event.holder or event.detail)}'
        f'<td>{source}</tr>'
        for event, source in reversed(ordered)
    )
    parts.append('<table class="events"><thead><tr><th>time (UTC)<th>event<th>token<th>holder / refusal<th>from'
                 f'</tr></thead><tbody>{rows}</tbody></table>')
    return "".join(parts)

