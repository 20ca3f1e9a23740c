"""The one timeline of the project: lanes of leases, writes and faults, as text, as an HTML fragment, as a page.

`stockade check --report`, `stockade history --html` and the dashboard's scope
page (``/ui/scope/NAME``) all draw with it, so a lease, a refused write or a
pause looks the same wherever it is shown. The renderer is pure: it takes
`Event` values and returns a string; it reads no clock and opens no file.

- `render_fragment` is the drawing: a legend, one SVG per case and a table of
  the events. It has no ``style`` attribute, no ``<style>`` and no script:
  every look comes from classes, styled by `CSS`. The dashboard serves `CSS`
  as its sheet ``/ui/static/timeline.css`` (its Content-Security-Policy allows
  no inline style).
- `render_html` is a whole page around the fragment, with `CSS` inline: one
  file with no script, no font and no network request, so it can be mailed,
  archived or opened offline.
- `journal_events` turns a scope's journal (``stockade history``'s events: the
  coordinator's grants, releases and expiries, the store's refusals) into
  `Event` values: the dashboard and ``stockade history --html`` both use it.

    page = render_html("stockade check", events, verdicts=[Verdict("pause", True, "0 of 20 ...")])

Each lane is one worker (or holder). On it: a bar per lease, labelled with its
token, from its grant to its release, expiry or the lane's next grant, ended by
a tick (dark: released, orange: expired); a circle per write (green accepted,
red refused, grey replayed), a refused one labelled with the token it carried;
a shaded band per pause or delay. Faults that concern no lane (a restart, a
restore) are vertical marks across all lanes. Every marker carries
``data-kind`` and ``data-token``, so a test can count what was drawn.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stockade.core.journal import HistoryEvent

__all__ = ["Event", "Verdict", "SetupLine", "render_text", "render_fragment", "render_html", "journal_events",
           "CSS", "EVENT_KINDS", "OUTCOMES", "REFUSED_LANE"]

#: What an event may be. ``pause``/``resume`` and ``delay``/``deliver`` open and close a shaded band.
EVENT_KINDS = ("grant", "release", "expire", "write", "pause", "resume", "delay", "deliver", "fault", "note")
#: What a write's outcome may be.
OUTCOMES = ("accepted", "refused", "replayed")
#: The lane of a journal's refused writes (a refusal names no holder).
REFUSED_LANE = "refused by the store"

_LANE_PX = 56
_LEFT_PX = 150
_PLOT_PX = 1000
_TOP_PX = 34
_WIDTH_PX = _LEFT_PX + _PLOT_PX + 30
_CHAR_PX = 7.5  # about one character of an 11 px label, bold or not (digits; the ellipsis a little wider)
_LABEL_GAP_PX = 8.0  # the least room between two labels on one row
_HIGH_WATER = re.compile(r"high-water (\d+)")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened, on one lane, at ``at_ms`` (any origin; the drawing starts at the first event).

    Attributes:
        at_ms: when, in milliseconds.
        lane: the worker or holder it belongs to ("" for a fault across every lane).
        kind: one of `EVENT_KINDS`.
        token: the token granted, written with, or refused (None if none).
        outcome: a write's outcome, one of `OUTCOMES`.
        mark: the resource's high-water mark the write met, when known.
        case: the case (or scope) it belongs to.
        text: a short free description.
    """

    at_ms: float
    lane: str
    kind: str
    token: int | None = None
    outcome: str | None = None
    mark: int | None = None
    case: str = ""
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind must be one of {EVENT_KINDS}, not {self.kind!r}")
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {self.outcome!r}")

    def describe(self) -> str:
        """One line of text, without the time and lane."""
        parts = [self.kind]
        if self.token is not None:
            parts.append(f"token {self.token}")
        if self.outcome is not None:
            parts.append(self.outcome.upper())
        if self.mark is not None:
            parts.append(f"mark {self.mark}")
        if self.text:
            parts.append(self.text)
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One case's result: ``held`` and the figure that says why (``"0 of 20 stale writes applied"``).

    ``ran`` is False for a case that could not run (an error that is no verdict: a worker or a server gone);
    ``held`` is then False and the figure is ``"could not run: <why>"``.
    """

    case: str
    held: bool
    figure: str
    ran: bool = True

    @property
    def status(self) -> str:
        """``held``, ``BROKEN`` or ``could not run``."""
        return "held" if self.held else "BROKEN" if self.ran else "could not run"


@dataclass(frozen=True, slots=True)
class SetupLine:
    """One precondition of the resource: its name, what was found, and ``ok``, ``warn`` or ``FAIL``."""

    name: str
    found: str
    verdict: str


def journal_events(events: Iterable[tuple[HistoryEvent, str]]) -> list[Event]:
    """A scope's journal as timeline events; ``events`` are ``(event, source)`` pairs, as ``stockade history`` reads.

    A grant, release or expiry goes on its holder's lane (an expiry without a
    holder on the lane of the grant of its token); a refusal is a refused write
    on `REFUSED_LANE`, with the refused token and the mark that refused it
    (read from its detail, ``"stale, high-water 8"``).
    """
    drawn: list[Event] = []
    holder_of: dict[int, str] = {}  # token -> the holder it was granted to
    for event, _source in events:
        if event.kind == "reject":
            found = _HIGH_WATER.search(event.detail)
            drawn.append(Event(at_ms=event.at_unix_ms, lane=REFUSED_LANE, kind="write", token=event.token_value,
                               outcome="refused", mark=int(found.group(1)) if found else None, case=event.scope,
                               text=event.detail))
            continue
        lane = event.holder or holder_of.get(event.token_value, "?")
        holder_of.setdefault(event.token_value, lane)
        drawn.append(Event(at_ms=event.at_unix_ms, lane=lane, kind=event.kind, token=event.token_value,
                           case=event.scope, text=event.detail))
    return drawn


def render_text(events: Iterable[Event]) -> str:
    """The events as lines: ``+time  lane  description``, in time order."""
    ordered = sorted(events, key=lambda e: e.at_ms)
    if not ordered:
        return ""
    origin = ordered[0].at_ms
    width = max(len(e.lane) for e in ordered) or 1
    return "\n".join(f"  +{(e.at_ms - origin) / 1000:8.3f}s  {(e.lane or '--'):<{width}}  "
                     f"{(e.case + ': ') if e.case else ''}{e.describe()}" for e in ordered)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(token: int | None) -> str:
    """A token as a label: whole up to 6 digits, else its last 4 (the full value is in the tooltip and the table)."""
    text = "" if token is None else str(token)
    return text if len(text) <= 6 else "\u2026" + text[-4:]


def _utc(at_ms: float) -> str:
    seconds, ms = divmod(int(at_ms), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def _data(event: Event) -> str:
    """The attributes that say what a marker is: its kind, its token, and a write's outcome."""
    out = f' data-kind="{_esc(event.kind)}"'
    if event.token is not None:
        out += f' data-token="{event.token}"'
    if event.outcome is not None:
        out += f' data-outcome="{_esc(event.outcome)}"'
    return out


def _lanes(events: Sequence[Event]) -> list[str]:
    return list(dict.fromkeys(e.lane for e in events if e.lane))


def _ticks(span_ms: float) -> list[float]:
    """Round times from 0 to ``span_ms``, at most about ten: steps of 1, 2 or 5 times a power of ten ms."""
    step = 1.0
    while span_ms / step > 10:
        for factor in (2.0, 2.5, 2.0):  # 1 -> 2 -> 5 -> 10
            step *= factor
            if span_ms / step <= 10:
                break
    return [i * step for i in range(int(span_ms // step) + 1)]


class _Plot:
    """The geometry of one drawing: time to x, lane to y."""

    def __init__(self, events: Sequence[Event], until_ms: float | None) -> None:
        self.lanes = _lanes(events)
        self.origin = min(e.at_ms for e in events)
        self.end = max([e.at_ms for e in events] + ([until_ms] if until_ms is not None else []))
        self.span = max(self.end - self.origin, 1.0)
        self.height = _TOP_PX + _LANE_PX * max(len(self.lanes), 1) + 30
        self._rows: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def label(self, row: tuple[str, str], text: str, x: float, *, anchor_end: bool = False) -> str:
        """The attribute that hides a text label where it would overprint one already placed on its row (a lane's
        lease labels, a lane's refused-write labels, the fault labels): ``""``, or ``visibility="hidden"``. The
        label stays in the page, its mark keeps its tooltip, and the table of events below has every value."""
        width = _CHAR_PX * len(text)
        left, right = (x - width, x) if anchor_end else (x, x + width)
        placed = self._rows.setdefault(row, [])
        if any(left < end + _LABEL_GAP_PX and begin < right + _LABEL_GAP_PX for begin, end in placed):
            return 'visibility="hidden" '
        placed.append((left, right))
        return ""

    def x(self, at_ms: float) -> float:
        return _LEFT_PX + (at_ms - self.origin) / self.span * _PLOT_PX

    def y(self, lane: str) -> float:
        return _TOP_PX + _LANE_PX * self.lanes.index(lane)


def _svg(events: Sequence[Event], *, until_ms: float | None, wall_clock: bool) -> str:
    """One drawing: a lane per worker, the time axis on top, faults as vertical lines."""
    plot = _Plot(events, until_ms)
    span, height = plot.span, plot.height
    out = [f'<svg class="tl-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH_PX} {height}" '
           f'width="{_WIDTH_PX}" height="{height}" role="img" aria-label="timeline">']
    if wall_clock:
        out.append(f'<text x="8" y="{_TOP_PX - 22}" class="tick start">from {_esc(_utc(plot.origin))}</text>')
    for tick in _ticks(span):  # the time axis
        tx = plot.x(plot.origin + tick)
        out.append(f'<line x1="{tx:.1f}" y1="{_TOP_PX - 6}" x2="{tx:.1f}" y2="{height - 30}" class="grid"/>')
        label = f"{tick / 1000:.2f} s" if span >= 2000 else f"{tick:.0f} ms"
        out.append(f'<text x="{tx:.1f}" y="{_TOP_PX - 10}" class="tick">{label}</text>')
    for lane in plot.lanes:
        ly = plot.y(lane)
        out.append(f'<g class="lane" data-lane="{_esc(lane)}"><rect x="0" y="{ly}" width="{_WIDTH_PX}" '
                   f'height="{_LANE_PX}" class="band"/><text x="8" y="{ly + _LANE_PX / 2 + 5}" '
                   f'class="lanelabel">{_esc(lane)}</text></g>')
    out += _bars(events, plot)
    for event in events:
        if event.kind == "fault" or (event.kind == "note" and not event.lane):
            fx, text = plot.x(event.at_ms), event.text or event.kind
            out.append(f'<g class="fault"{_data(event)}><line x1="{fx:.1f}" y1="{_TOP_PX}" x2="{fx:.1f}" '
                       f'y2="{height - 30}" class="faultline"/><text {plot.label(("", "fault"), text, fx + 3)}'
                       f'x="{fx + 3:.1f}" y="{height - 16}" class="faulttext">{_esc(text)}</text>'
                       f'<title>{_esc(event.describe())}</title></g>')
    for event in events:
        if event.kind == "write" and event.lane:
            out.append(_write(event, plot))
    out.append("</svg>")
    return "\n".join(out)


def _write(event: Event, plot: _Plot) -> str:
    """A write's circle; a refused one has a cross and its token (and the mark, when known) under it."""
    wx, wy = plot.x(event.at_ms), plot.y(event.lane) + _LANE_PX / 2 + 8
    radius = 4 if event.outcome == "replayed" else 6  # a retry's dot drawn over the write it replays
    label = ""
    if event.outcome == "refused":
        side = "right" if wx < _LEFT_PX + _PLOT_PX / 2 else "left"  # the label stays inside the drawing
        lx = wx - 4 if side == "right" else wx + 4
        below = _short(event.token) + (f" < {_short(event.mark)}" if event.mark is not None else "")
        label = (f'<text x="{wx:.1f}" y="{wy + 4:.1f}" class="glyph">\u2715</text>'
                 f'<text {plot.label((event.lane, "write"), below, lx, anchor_end=side == "left")}'
                 f'x="{lx:.1f}" y="{wy + 19:.1f}" class="wlabel {side}">{_esc(below)}</text>')
    return (f'<g class="write {_esc(event.outcome or "")}"{_data(event)}><circle cx="{wx:.1f}" cy="{wy:.1f}" '
            f'r="{radius}"/>{label}<title>{_esc(event.lane)}: {_esc(event.describe())}</title></g>')


def _bars(events: Sequence[Event], plot: _Plot) -> list[str]:
    """Lease bars (grant to release/expire/next grant), their ends, and shaded pauses and delays, per lane."""
    bars: list[str] = []
    ends: list[str] = []  # drawn over the bars
    labels: list[str] = []  # the bars' tokens, over every bar (a later bar never covers an earlier one's label)
    for lane in plot.lanes:
        opened: dict[str, Event] = {}
        spans: list[tuple[str, Event, float]] = []
        for event in (e for e in events if e.lane == lane):
            if event.kind == "grant":
                if "lease" in opened:
                    spans.append(("lease", opened.pop("lease"), event.at_ms))
                opened["lease"] = event
            elif event.kind in ("release", "expire"):
                if "lease" in opened:
                    spans.append(("lease", opened.pop("lease"), event.at_ms))
                ends.append(_end(event, plot))
            elif event.kind in ("pause", "delay"):
                opened[event.kind] = event
            elif event.kind in ("resume", "deliver"):
                begun = opened.pop("pause" if event.kind == "resume" else "delay", None)
                if begun is not None:
                    spans.append((begun.kind, begun, event.at_ms))
        spans += [(kind, begun, plot.end) for kind, begun in opened.items()]
        for kind, begun, until in spans:
            x0, top = plot.x(begun.at_ms), plot.y(lane)
            x1 = max(plot.x(until), x0 + 2)
            if kind == "lease":
                label = _short(begun.token)
                fits, place = x1 - x0 >= 7 * len(label) + 6, ""
                lx = x0 + 3  # the label in its bar; a short bar's after its end, or before it at the right edge
                if not fits:
                    lx, place = (x1 + 5, "") if x1 + 7 * len(label) + 10 < _WIDTH_PX else (x0 - 5, " before")
                hide = plot.label((lane, "lease"), label, lx, anchor_end=bool(place))
                bars.append(f'<g class="lease"{_data(begun)}><rect x="{x0:.1f}" y="{top + 8}" width="{x1 - x0:.1f}" '
                            f'height="14" rx="3"/><title>{_esc(lane)}: lease, token {_esc(begun.token)}</title></g>')
                labels.append(f'<text {hide}x="{lx:.1f}" y="{top + 19}" class="leaselabel{place}">{_esc(label)}</text>')
            else:
                bars.append(f'<rect x="{x0:.1f}" y="{top + 2}" width="{x1 - x0:.1f}" height="{_LANE_PX - 4}" '
                            f'class="{kind}"{_data(begun)}><title>{_esc(lane)}: {kind} {_esc(begun.text)}</title>'
                            '</rect>')
    return bars + ends + labels


def _end(event: Event, plot: _Plot) -> str:
    """The tick that ends a lease: dark when released, orange when it expired."""
    ex, top = plot.x(event.at_ms), plot.y(event.lane)
    return (f'<g class="end {event.kind}"{_data(event)}><line x1="{ex:.1f}" y1="{top + 4}" x2="{ex:.1f}" '
            f'y2="{top + 26}"/><title>{_esc(event.lane)}: {_esc(event.describe())}</title></g>')


#: The timeline's style sheet: every rule is under ``.timeline`` (the fragment's root), by class only.
#: Colours are custom properties with light defaults, so a page may set them (the dashboard's dark theme).
CSS = """
.timeline{--tl-fg:#222;--tl-muted:#666;--tl-band:#fafafa;--tl-line:#e4e4e4;--tl-grid:#ddd;--tl-lease:#9ecae1;
--tl-lease-line:#3182bd;--tl-lease-text:#08306b;--tl-ok:#1a9850;--tl-bad:#d73027;--tl-replay:#7f7f7f;
--tl-expire:#e6550d;--tl-release:#08306b;--tl-fault:#6a3d9a;--tl-pause:#999;--tl-delay:#fdae61;color:var(--tl-fg)}
.timeline .tl-svg{display:block;max-width:100%;height:auto;margin:4px 0 12px}
.timeline text{fill:var(--tl-fg);font:12px system-ui,-apple-system,'Segoe UI',sans-serif}
.timeline .band{fill:var(--tl-band);stroke:var(--tl-line)}.timeline .lanelabel{font-weight:600;font-size:13px}
.timeline .grid{stroke:var(--tl-grid)}.timeline .tick{font-size:11px;fill:var(--tl-muted);text-anchor:middle}
.timeline .tick.start{text-anchor:start}
.timeline .lease rect{fill:var(--tl-lease);stroke:var(--tl-lease-line)}
.timeline .leaselabel{font-size:11px;fill:var(--tl-lease-text)}.timeline .leaselabel.before{text-anchor:end}
.timeline .end line{stroke-width:3}.timeline .end.release line{stroke:var(--tl-release)}
.timeline .end.expire line{stroke:var(--tl-expire)}
.timeline .pause{fill:var(--tl-pause);fill-opacity:.28}.timeline .delay{fill:var(--tl-delay);fill-opacity:.35}
.timeline .write circle{fill:#444}.timeline .write.accepted circle{fill:var(--tl-ok)}
.timeline .write.refused circle{fill:var(--tl-bad)}.timeline .write.replayed circle{fill:var(--tl-replay)}
.timeline .glyph{font-size:10px;fill:#fff;text-anchor:middle}
.timeline .wlabel{font-size:11px;font-weight:600;fill:var(--tl-bad)}.timeline .wlabel.left{text-anchor:end}
.timeline .faultline{stroke:var(--tl-fault);stroke-width:2;stroke-dasharray:4 3}
.timeline .faulttext{font-size:11px;fill:var(--tl-fault)}
.timeline .legend span{display:inline-block;margin-right:16px}
.timeline .sw{display:inline-block;width:14px;height:10px;vertical-align:middle;margin-right:4px;
border:1px solid #888}.timeline .sw.k-lease{background:var(--tl-lease)}.timeline .sw.k-accepted{background:var(--tl-ok)}
.timeline .sw.k-refused{background:var(--tl-bad)}.timeline .sw.k-replayed{background:var(--tl-replay)}
.timeline .sw.k-release{background:var(--tl-release)}.timeline .sw.k-expire{background:var(--tl-expire)}
.timeline .sw.k-pause{background:#c8c8c8}.timeline .sw.k-delay{background:#fdd9b5}
.timeline .sw.k-fault{background:var(--tl-fault)}
.timeline table.events{border-collapse:collapse;margin:4px 0}
.timeline table.events td,.timeline table.events th{border:1px solid var(--tl-line);padding:3px 10px;text-align:left}
.timeline table.events .num{text-align:right;font-variant-numeric:tabular-nums}
.timeline table.events tr.refused td{color:var(--tl-bad)}.timeline table.events tr.expire td{color:var(--tl-expire)}
.timeline table.events .kind{font-weight:600}.timeline .empty{color:var(--tl-muted)}
"""

_PAGE_CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}h3{font-size:14px;margin:14px 0 2px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ccc;padding:3px 10px;text-align:left}
.held,.ok{color:#1a9850;font-weight:600}.broken,.FAIL{color:#d73027;font-weight:600}.could-not-run{color:#6a3d9a;font-weight:600}.warn{color:#b8860b;font-weight:600}
"""

_LEGEND = (("lease", "lease (token)"), ("release", "released"), ("expire", "expired"),
           ("accepted", "write accepted"), ("refused", "write refused (token < mark)"),
           ("replayed", "write replayed (R3)"), ("pause", "paused (SIGSTOP)"), ("delay", "request delayed"),
           ("fault", "fault (restart, restore)"))


def _legend(events: Sequence[Event]) -> str:
    """What each mark means, for the kinds the drawing has."""
    present = {e.kind for e in events} | {e.outcome for e in events if e.outcome} | {"lease"}
    return '<p class="legend">' + "".join(f'<span><i class="sw k-{key}"></i>{_esc(label)}</span>'
                                          for key, label in _LEGEND if key in present) + "</p>"


def _table(events: Sequence[Event], *, wall_clock: bool, newest_first: bool) -> str:
    origin = events[0].at_ms
    rows = []
    for e in reversed(events) if newest_first else events:
        when = _utc(e.at_ms) if wall_clock else f"+{(e.at_ms - origin) / 1000:.3f} s"
        kind = f"{e.kind} {e.outcome}" if e.outcome else e.kind
        rows.append(f'<tr class="{_esc(e.outcome or e.kind)}"><td>{when}</td><td>{_esc(e.lane or "--")}</td>'
                    f'<td class="kind">{_esc(kind)}</td><td class="num">{"" if e.token is None else e.token}</td>'
                    f'<td class="num">{"" if e.mark is None else e.mark}</td><td>{_esc(e.text)}</td></tr>')
    head = "time (UTC)" if wall_clock else "time"
    return (f'<table class="events"><thead><tr><th>{head}</th><th>lane</th><th>event</th><th>token</th>'
            f'<th>mark</th><th>detail</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def render_fragment(events: Sequence[Event], *, until_ms: float | None = None, wall_clock: bool = False,
                    newest_first: bool = False, empty: str = "no events") -> str:
    """The drawing as a ``<div class="timeline">``: legend, one SVG per case, and the table of the events.

    Args:
        events: what happened (any order; drawn in time order).
        until_ms: draw the axis (and a lease still open) up to here at least (the dashboard: now).
        wall_clock: ``at_ms`` are Unix milliseconds: the table shows UTC times, the axis its start.
        newest_first: the table's order (the drawing is always oldest to newest, left to right).
        empty: the text shown when there is no event.
    """
    ordered = sorted(events, key=lambda e: e.at_ms)
    if not ordered:
        return f'<div class="timeline"><p class="empty">{_esc(empty)}</p></div>'
    parts = ['<div class="timeline">', _legend(ordered)]
    cases = list(dict.fromkeys(e.case for e in ordered))
    for case in cases:  # one drawing per case, each on its own time scale
        if len(cases) > 1:
            parts.append(f'<h3 class="case">{_esc(case or "other")}</h3>')
        parts.append(_svg([e for e in ordered if e.case == case], until_ms=until_ms, wall_clock=wall_clock))
    parts.append(_table(ordered, wall_clock=wall_clock, newest_first=newest_first))
    parts.append("</div>")
    return "\n".join(parts)


def render_html(title: str, events: Sequence[Event], *, verdicts: Sequence[Verdict] = (),
                setup: Sequence[SetupLine] = (), summary: str = "", wall_clock: bool = False) -> str:
    """A self-contained HTML page: the verdicts, the setup lines, and `render_fragment` with `CSS` inline.

    Args:
        title: the page's heading.
        events: what happened (any order; drawn in time order).
        verdicts: one row per case.
        setup: one row per precondition of the resource.
        summary: a line under the heading (the overall verdict).
        wall_clock: as `render_fragment`.
    """
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_esc(title)}</title><style>{_PAGE_CSS}{CSS}</style></head><body>", f"<h1>{_esc(title)}</h1>"]
    if summary:
        parts.append(f'<p id="summary">{_esc(summary)}</p>')
    if verdicts:
        parts.append('<h2>Verdicts</h2><table id="verdicts"><tr><th>case</th><th>verdict</th><th>figure</th></tr>')
        parts += [f'<tr><td>{_esc(v.case)}</td><td class="{v.status.lower().replace(" ", "-")}">'
                  f'{v.status}</td><td>{_esc(v.figure)}</td></tr>' for v in verdicts]
        parts.append("</table>")
    if setup:
        parts.append('<h2>Setup</h2><table id="setup"><tr><th>precondition</th><th>found</th><th>verdict</th></tr>')
        parts += [f'<tr><td>{_esc(s.name)}</td><td>{_esc(s.found)}</td><td class="{_esc(s.verdict)}">'
                  f'{_esc(s.verdict)}</td></tr>' for s in setup]
        parts.append("</table>")
    parts.append("<h2>Timeline</h2>" + render_fragment(events, wall_clock=wall_clock))
    parts.append("</body></html>")
    return "\n".join(parts)
