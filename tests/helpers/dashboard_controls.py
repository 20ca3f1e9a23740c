"""Deliberately broken variants of the dashboard of `stockade serve`, and one knob: what its tests must catch.

Usage: ``python dashboard_controls.py CONTROL [serve args...]``. Each control patches one rule:

- ``leaks-lease-id``: each row of a snapshot carries its lease's id (a secret: it renews and releases).
- ``sees-every-scope``: a session ignores its token's scope patterns.
- ``unbounded-stream``: a slow reader's stream is never closed: its unsent bytes grow without bound.
- ``drops-expiries``: the scope page's timeline leaves out the coordinator's expiries.
- ``drops-refusals``: the scope page's timeline leaves out the store's refusals (its journal is not read).
- ``forgets-logouts``: logouts are kept in memory only, so a restart brings a logged-out cookie back.
- ``frozen-stream``: a stream sends its first snapshot and nothing after it (no live update).
- ``console-error``: the page's script logs an error to the browser's console once loaded.
- ``no-reconnect``: the page gives up when its stream is cut (it closes the stream and never retries).
- ``small-stream-buffer`` (a knob, not a control): the bound on a stream's unsent bytes is 16 KiB, so that a
  test reaches it in a few frames (the real bound is 256 KiB).

``unbounded-stream`` and ``small-stream-buffer`` also give each accepted socket a 4 KiB kernel send buffer
(a slow network's), so that what the peer does not read piles up in the server's process where it can be seen,
not in the kernel's buffers (up to 4 MiB on loopback).
"""

from __future__ import annotations

import asyncio
import socket
import sys

from stockade import timeline
from stockade.cli import serve
from stockade.server import _dashboard, _dashboard_view, _http

CONTROL = sys.argv[1]

if CONTROL == "leaks-lease-id":
    original_rows = _dashboard_view._rows

    async def rows(leases, store, view):  # type: ignore[no-untyped-def]
        found, seen, exact = await original_rows(leases, store, view)
        for row in found:
            lease = leases.records[row["scope"]].lease
            row["lease"] = lease.lease_id if lease is not None else None
        return found, seen, exact

    _dashboard_view._rows = rows  # type: ignore[assignment]

elif CONTROL == "sees-every-scope":
    _dashboard_view.View.sees = lambda self, scope: not self.text or self.text in scope  # type: ignore[method-assign]

elif CONTROL in ("unbounded-stream", "small-stream-buffer"):
    _dashboard.STREAM_BUFFER_BYTES_MAX = 10**15 if CONTROL == "unbounded-stream" else 16 * 1024
    original_made = _http.HttpProtocol.connection_made

    def connection_made(self, transport):  # type: ignore[no-untyped-def]
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        original_made(self, transport)

    _http.HttpProtocol.connection_made = connection_made  # type: ignore[method-assign]

elif CONTROL == "drops-expiries":  # the dashboard imports the timeline's functions as it draws a page
    original_events = timeline.journal_events
    timeline.journal_events = lambda pairs: [e for e in original_events(pairs) if e.kind != "expire"]

elif CONTROL == "drops-refusals":
    _dashboard.rejections = lambda path, scope, limit: []

elif CONTROL == "forgets-logouts":
    _dashboard._write_logouts = lambda path, logged_out: None

elif CONTROL == "frozen-stream":
    _dashboard.Dashboard._tick = lambda self: asyncio.sleep(3600)  # type: ignore[method-assign]

elif CONTROL in ("console-error", "no-reconnect"):
    script = _dashboard._file("dashboard.js").decode()
    if CONTROL == "console-error":
        script += '\nconsole.error("control: an error on the page");\n'
    else:
        for old, new in (("state.retry = setTimeout(connect, 1000);", "state.retry = null;"),
                         ('else setStatus("reconnecting…", false);',
                          'else { source.close(); setStatus("gave up", false); }')):
            assert script.count(old) == 1, old  # the control must change the page, not silently nothing
            script = script.replace(old, new)
    _dashboard._files["dashboard.js"] = script.encode()

else:
    raise SystemExit(f"unknown control {CONTROL!r}")

asyncio.set_event_loop_policy(None)
sys.exit(serve.run(sys.argv[2:]))
