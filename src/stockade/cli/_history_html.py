"""``stockade history --html FILE``: a scope's journal drawn by the project's one timeline (`stockade.timeline`).

Each holder is a lane: a grant opens a lease bar labelled with its token, a
release or an expiry closes it; the store's refusals are refused writes on a
lane of their own. The page is the one `stockade check --report` writes.
"""

from __future__ import annotations

from pathlib import Path

from stockade.core.errors import InvalidArgument
from stockade.core.journal import HistoryEvent
from stockade.timeline import Event, render_html

__all__ = ["timeline_events", "write_timeline"]

REFUSED_LANE = "refused by the store"


def timeline_events(events: list[tuple[HistoryEvent, str]]) -> list[Event]:
    """The journal's events as timeline events (a rejection: a refused write with its token)."""
    drawn: list[Event] = []
    holder_of: dict[int, str] = {}  # token -> the holder it was granted to (an expiry names it too)
    for event, _source in events:
        if event.kind == "reject":
            drawn.append(Event(at_ms=event.at_unix_ms, lane=REFUSED_LANE, kind="write", token=event.token_value,
                               outcome="refused", case=event.scope, text=event.detail))
            continue
        lane = event.holder or holder_of.get(event.token_value, "?")
        holder_of.setdefault(event.token_value, lane)
        drawn.append(Event(at_ms=event.at_unix_ms, lane=lane, kind=event.kind, token=event.token_value,
                           case=event.scope, text=event.detail))
    return drawn


def write_timeline(path: Path, scope: str, events: list[tuple[HistoryEvent, str]]) -> None:
    """Write the page; a directory that is not there is `InvalidArgument` (nothing written)."""
    if not path.parent.is_dir():
        raise InvalidArgument("--html", f"{path.parent}: no such directory")
    page = render_html(f"stockade history: {scope}", timeline_events(events),
                       summary=f"{len(events)} events of scope {scope!r}, oldest first")
    path.write_text(page, encoding="utf-8")
