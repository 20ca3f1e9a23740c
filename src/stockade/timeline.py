"""The one timeline of the project: lanes of leases, writes and faults, as text and as a self-contained HTML page.

`stockade check` draws its run with it and `stockade history --html` draws a
scope's journal with it, so a lease, a refused write or a pause looks the same
wherever it is shown. The renderer is pure: it takes `Event` values and returns
a string; it reads no clock and opens no file.

The page is one file: inline CSS and an inline SVG, no script, no font, no
network request, so it can be mailed, archived or opened offline.

    page = render_html("stockade check", events, verdicts=[Verdict("pause", True, "0 of 20 ...")])

Each lane is one worker (or holder). On it: a bar per lease, labelled with its
token, from its grant to its release, expiry or the lane's next grant; a
circle per write (green accepted, red refused, grey replayed), labelled with
the token it carried; a shaded band per pause or delay. Faults that concern no
lane (a restart, a restore) are vertical marks across all lanes.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Event", "Verdict", "SetupLine", "render_text", "render_html", "EVENT_KINDS", "OUTCOMES"]

#: What an event may be. ``pause``/``resume`` and ``delay``/``deliver`` open and close a shaded band.
EVENT_KINDS = ("grant", "release", "expire", "write", "pause", "resume", "delay", "deliver", "fault", "note")
#: What a write's outcome may be.
OUTCOMES = ("accepted", "refused", "replayed")

_OUTCOME_COLOUR = {"accepted": "#1a9850", "refused": "#d73027", "replayed": "#7f7f7f"}
_LANE_PX = 56
_LEFT_PX = 150
_PLOT_PX = 1000
_TOP_PX = 34


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened, on one lane, at ``at_ms`` (any origin; the page starts at the first event).

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
    """One case's result: ``held`` and the figure that says why (``"0 of 20 stale writes applied"``)."""

    case: str
    held: bool
    figure: str


@dataclass(frozen=True, slots=True)
class SetupLine:
    """One precondition of the resource: its name, what was found, and ``ok``, ``warn`` or ``FAIL``."""

    name: str
    found: str
    verdict: str


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
    """A token as a label: whole up to 6 digits, else its last 4 (the full value is in the tooltip and the log)."""
    text = "" if token is None else str(token)
    return text if len(text) <= 6 else "\u2026" + text[-4:]


def _lanes(events: Sequence[Event]) -> list[str]:
    seen: list[str] = []
    for event in events:
        if event.lane and event.lane not in seen:
            seen.append(event.lane)
    return seen


def _ticks(span_ms: float) -> list[float]:
    """Round times from 0 to ``span_ms``, at most about ten: steps of 1, 2 or 5 times a power of ten ms."""
    step = 1.0
    while span_ms / step > 10:
        for factor in (2.0, 2.5, 2.0):  # 1 -> 2 -> 5 -> 10
            step *= factor
            if span_ms / step <= 10:
                break
    return [i * step for i in range(int(span_ms // step) + 1)]


def _svg(events: Sequence[Event]) -> str:
    """One drawing: a lane per worker, the time axis on top, faults as vertical lines."""
    lanes = _lanes(events)
    origin = min(e.at_ms for e in events)
    span = max(max(e.at_ms for e in events) - origin, 1.0)
    height = _TOP_PX + _LANE_PX * max(len(lanes), 1) + 30

    def x(at_ms: float) -> float:
        return _LEFT_PX + (at_ms - origin) / span * _PLOT_PX

    def y(lane: str) -> float:
        return _TOP_PX + _LANE_PX * lanes.index(lane)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT_PX + _PLOT_PX + 30}" height="{height}" '
           f'role="img" aria-label="timeline">']
    for tick in _ticks(span):  # the time axis
        tx = x(origin + tick)
        out.append(f'<line x1="{tx:.1f}" y1="{_TOP_PX - 6}" x2="{tx:.1f}" y2="{height - 30}" class="grid"/>')
        label = f"{tick / 1000:.2f} s" if span >= 2000 else f"{tick:.0f} ms"
        out.append(f'<text x="{tx:.1f}" y="{_TOP_PX - 10}" class="tick">{label}</text>')
    for lane in lanes:
        ly = y(lane)
        out.append(f'<g class="lane" data-lane="{_esc(lane)}"><rect x="0" y="{ly}" width="{_LEFT_PX + _PLOT_PX + 30}" '
                   f'height="{_LANE_PX}" class="band"/><text x="8" y="{ly + _LANE_PX / 2 + 5}" '
                   f'class="lanelabel">{_esc(lane)}</text></g>')
    out += _bars(events, lanes, x, y)
    for event in events:
        if event.kind == "fault" or (event.kind == "note" and not event.lane):
            fx = x(event.at_ms)
            out.append(f'<g class="fault"><line x1="{fx:.1f}" y1="{_TOP_PX}" x2="{fx:.1f}" y2="{height - 30}" '
                       f'class="faultline"/><text x="{fx + 3:.1f}" y="{height - 16}" class="faulttext">'
                       f'{_esc(event.text or event.kind)}</text><title>{_esc(event.describe())}</title></g>')
    for event in events:
        if event.kind == "write" and event.lane:
            wx, wy = x(event.at_ms), y(event.lane) + _LANE_PX / 2 + 8
            colour = _OUTCOME_COLOUR.get(event.outcome or "", "#444")
            glyph = "\u2715" if event.outcome == "refused" else ""
            radius = 4 if event.outcome == "replayed" else 6  # a retry's dot drawn over the write it replays
            out.append(f'<g class="write {_esc(event.outcome or "")}"><circle cx="{wx:.1f}" cy="{wy:.1f}" r="{radius}" '
                       f'fill="{colour}"/><text x="{wx:.1f}" y="{wy + 4:.1f}" class="glyph">{glyph}</text>'
                       + (f'<text x="{wx:.1f}" y="{wy + 19:.1f}" class="wlabel">{_esc(_short(event.token))}</text>'
                          if event.outcome == "refused" else "") +
                       f'<title>{_esc(event.lane)}: {_esc(event.describe())}</title></g>')
    out.append("</svg>")
    return "\n".join(out)


def _bars(events: Sequence[Event], lanes: list[str], x: object, y: object) -> list[str]:
    """Lease bars (grant to release/expire/next grant) and shaded pauses and delays, per lane."""
    assert callable(x) and callable(y)
    out: list[str] = []
    end = max(e.at_ms for e in events)
    for lane in lanes:
        own = [e for e in events if e.lane == lane]
        opened: dict[str, Event] = {}
        spans: list[tuple[str, Event, float]] = []
        for event in own:
            if event.kind == "grant":
                if "lease" in opened:
                    spans.append(("lease", opened.pop("lease"), event.at_ms))
                opened["lease"] = event
            elif event.kind in ("release", "expire") and "lease" in opened:
                spans.append(("lease", opened.pop("lease"), event.at_ms))
            elif event.kind in ("pause", "delay"):
                opened[event.kind] = event
            elif event.kind in ("resume", "deliver"):
                begun = opened.pop("pause" if event.kind == "resume" else "delay", None)
                if begun is not None:
                    spans.append((begun.kind, begun, event.at_ms))
        spans += [(kind, begun, end) for kind, begun in opened.items()]
        for kind, begun, until in spans:
            x0, x1, top = x(begun.at_ms), max(x(until), x(begun.at_ms) + 2), y(lane)
            if kind == "lease":
                out.append(f'<g class="lease"><rect x="{x0:.1f}" y="{top + 8}" width="{x1 - x0:.1f}" height="14" '
                           f'rx="3"/><text x="{x0 + 3:.1f}" y="{top + 19}" class="leaselabel">'
                           f'{_esc(_short(begun.token))}</text><title>{_esc(lane)}: lease, token {_esc(begun.token)}'
                           f'</title></g>')
            else:
                out.append(f'<rect x="{x0:.1f}" y="{top + 2}" width="{x1 - x0:.1f}" height="{_LANE_PX - 4}" '
                           f'class="{kind}"><title>{_esc(lane)}: {kind} {_esc(begun.text)}</title></rect>')
    return out


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}h3{font-size:14px;margin:14px 0 2px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ccc;padding:3px 10px;text-align:left}
.held,.ok{color:#1a9850;font-weight:600}.broken,.FAIL{color:#d73027;font-weight:600}.warn{color:#b8860b;font-weight:600}
.band{fill:#fafafa;stroke:#e4e4e4}.lanelabel{font-weight:600;font-size:13px}.grid{stroke:#ddd}
.tick{font-size:11px;fill:#666;text-anchor:middle}.lease rect{fill:#9ecae1;stroke:#3182bd}
.leaselabel{font-size:11px;fill:#08306b}.pause{fill:#999;fill-opacity:.28}.delay{fill:#fdae61;fill-opacity:.35}
.glyph{font-size:10px;fill:#fff;text-anchor:middle}.wlabel{font-size:10px;fill:#333;text-anchor:middle}
.faultline{stroke:#6a3d9a;stroke-width:2;stroke-dasharray:4 3}.faulttext{font-size:11px;fill:#6a3d9a}
.legend span{display:inline-block;margin-right:16px}.sw{display:inline-block;width:14px;height:10px;
vertical-align:middle;margin-right:4px;border:1px solid #888}pre{background:#f6f6f6;padding:8px;overflow:auto}
"""


def _legend() -> str:
    items = [("#9ecae1", "lease (token)"), ("#1a9850", "write accepted"), ("#d73027", "write refused"),
             ("#7f7f7f", "write replayed (R3)"), ("#c8c8c8", "paused (SIGSTOP)"), ("#fdd9b5", "request delayed"),
             ("#6a3d9a", "fault (restart, restore)")]
    return '<p class="legend">' + "".join(
        f'<span><i class="sw" style="background:{colour}"></i>{_esc(label)}</span>' for colour, label in items) + "</p>"


def render_html(title: str, events: Sequence[Event], *, verdicts: Sequence[Verdict] = (),
                setup: Sequence[SetupLine] = (), summary: str = "") -> str:
    """A self-contained HTML page: the verdicts, the setup lines, the timeline and the event log.

    Args:
        title: the page's heading.
        events: what happened (any order; drawn in time order).
        verdicts: one row per case.
        setup: one row per precondition of the resource.
        summary: a line under the heading (the overall verdict).
    """
    ordered = sorted(events, key=lambda e: e.at_ms)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{_esc(title)}</h1>"]
    if summary:
        parts.append(f'<p id="summary">{_esc(summary)}</p>')
    if verdicts:
        parts.append('<h2>Verdicts</h2><table id="verdicts"><tr><th>case</th><th>verdict</th><th>figure</th></tr>')
        parts += [f'<tr><td>{_esc(v.case)}</td><td class="{"held" if v.held else "broken"}">'
                  f'{"held" if v.held else "BROKEN"}</td><td>{_esc(v.figure)}</td></tr>' for v in verdicts]
        parts.append("</table>")
    if setup:
        parts.append('<h2>Setup</h2><table id="setup"><tr><th>precondition</th><th>found</th><th>verdict</th></tr>')
        parts += [f'<tr><td>{_esc(s.name)}</td><td>{_esc(s.found)}</td><td class="{_esc(s.verdict)}">'
                  f'{_esc(s.verdict)}</td></tr>' for s in setup]
        parts.append("</table>")
    parts.append("<h2>Timeline</h2>" + _legend())
    cases = list(dict.fromkeys(e.case for e in ordered))
    for case in cases:  # one drawing per case, each on its own time scale
        own = [e for e in ordered if e.case == case]
        if len(cases) > 1:
            parts.append(f'<h3 class="case">{_esc(case or "other")}</h3>')
        parts.append(_svg(own))
    if not ordered:
        parts.append("<p>no events</p>")
    parts.append(f'<h2>Event log</h2><pre id="log">{_esc(render_text(ordered))}</pre></body></html>')
    return "\n".join(parts)
