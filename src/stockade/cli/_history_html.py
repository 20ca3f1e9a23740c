"""``stockade history --html FILE``: a scope's journal drawn by the project's one timeline (`stockade.timeline`).

Each holder is a lane: a grant opens a lease bar labelled with its token, a
release or an expiry closes it; the store's refusals are refused writes on a
lane of their own. The drawing is the one the dashboard's scope page shows
(`stockade.timeline.journal_events`, then `render_fragment`), in the page
`stockade check --report` writes.
"""

from __future__ import annotations

from pathlib import Path

from stockade.core.errors import InvalidArgument
from stockade.core.journal import HistoryEvent
from stockade.timeline import journal_events, render_html

__all__ = ["write_timeline"]


def write_timeline(path: Path, scope: str, events: list[tuple[HistoryEvent, str]]) -> None:
    """Write the page; a directory that is not there is `InvalidArgument` (nothing written)."""
    if not path.parent.is_dir():
        raise InvalidArgument("--html", f"{path.parent}: no such directory")
    page = render_html(f"stockade history: {scope}", journal_events(events), wall_clock=True,
                       summary=f"{len(events)} events of scope {scope!r}, oldest first")
    path.write_text(page, encoding="utf-8")
