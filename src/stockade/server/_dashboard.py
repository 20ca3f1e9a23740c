"""The dashboard of ``stockade serve``: pages under ``/ui/``, read-only, live by server-sent events (docs/dashboard.md).

Paths (none of them writes a lease or a value; the API is untouched)::

    GET    /ui/                     the page (no data in it: its script asks the API below)
    GET    /ui/scope/{scope}        a scope's page: its timeline (`stockade.timeline`)
    GET    /ui/static/{name}        the page's script and style sheets, from the package (no CDN, no build)
    POST   /ui/session              a bearer token (in Authorization, no body) for a session cookie
    DELETE /ui/session              log out
    GET    /ui/api/session          whether auth is on and the request is logged in (to anyone)
    GET    /ui/api/state?q=&page=   one snapshot (`stockade.server._dashboard_view`) as JSON (?scope=NAME: one scope)
    GET    /ui/api/timeline/{scope} the scope's timeline, an HTML fragment drawn by `stockade.timeline`, the
                                    renderer of ``stockade history --html`` and ``stockade check --report``
    GET    /ui/events?q=&page=      the same snapshots as server-sent events, while the page is open

Auth: with ``--auth-tokens``, every ``/ui/api`` and ``/ui/events`` answer needs
a session cookie or a bearer token. The cookie is got once by ``POST
/ui/session`` with a token of the tokens file; it is signed with a key kept
in the data directory (`Sessions`), ``HttpOnly; SameSite=Strict; Path=/ui``
(``Secure`` over TLS), and it expires after `SESSION_S`. A session is limited to its token's scopes: it
sees those scopes and their timelines, not the server's health nor its
rejection counts (what ``/metrics`` shows, which such a token is refused).
No answer carries a token's MAC or a lease id (tokens show as their value).

Live updates: one task, while streams are open, looks every `TICK_S` at a
change marker (the coordinator's and the store's committed operations, the
queued acquires); when it moved, it builds one snapshot per distinct view and
sends it to the streams whose view changed; every `RESYNC_S` it sends anyway
(the page's countdowns are corrected, and a dead peer is found). So lock
cycles cost the dashboard at most ``1 / TICK_S`` snapshots a second per view,
however fast they come. Bounds: at most ``streams_max`` streams open
(``--dashboard-streams-max``; 503 beyond it); a stream whose peer has more
than `STREAM_BUFFER_BYTES_MAX` unread is closed, not buffered (the page
reconnects and starts from a fresh snapshot).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade import metrics
from stockade.coordinators.journal import HISTORY_PER_SCOPE
from stockade.core.errors import InvalidArgument
from stockade.core.limits import validate_scope
from stockade.resources.store._sqlite_journal import REJECTIONS_PER_SCOPE, rejections
from stockade.server._auth import BearerAuth, scope_allowed
from stockade.server._dashboard_view import Latency, View, snapshot, stable_part, view_of
from stockade.server._http import Request, Response, Stream, StreamSink, json_response, problem
from stockade.server._inputs import Problem, query, segment
from stockade.server._leases import LeaseService

__all__ = ["Dashboard", "PREFIX", "STREAMS_MAX", "TICK_S", "RESYNC_S", "STREAM_BUFFER_BYTES_MAX", "SESSION_S",
           "COOKIE", "Sessions", "session_key"]

PREFIX = "/ui/"
STREAMS_MAX = 100  # open event streams, all viewers together (--dashboard-streams-max)
TICK_S = 0.25  # how often the change marker is looked at: an event follows a change within this, plus a snapshot
RESYNC_S = 5.0
# Building snapshots runs on the server's event loop: after a tick that took B seconds, the next waits at least
# DUTY_FACTOR x B, so the dashboard takes at most 1 / (DUTY_FACTOR + 1) of the loop (with 100,000 scopes a
# first page took 62 ms here, 2026-12-05: updates then come every ~0.6 s or more, and lock cycles keep 90% of it).
DUTY_FACTOR = 9
BUILT_MAX = 256  # snapshots kept for reuse (one per view, within a tick)
STREAM_BUFFER_BYTES_MAX = 256 * 1024  # unsent bytes of one stream; beyond it the stream is closed
SESSION_S = 8 * 3600
COOKIE = "stockade_session"
_STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8",
           "timeline.css": "text/css; charset=utf-8"}
_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    # Nothing but this server: no CDN, no font, no inline script, and no framing by another site.
    ("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
]
DROPPED = metrics.REGISTRY.counter(
    "stockade_dashboard_streams_dropped_total", "Dashboard event streams closed because their peer read too slowly."
)


@dataclass(frozen=True)
class _Session:
    patterns: tuple[str, ...] | None


class Sessions:
    """Session cookies ``EXPIRES.WHO.MAC``, signed with a key of the data directory (`session_key`).

    ``WHO`` is a keyed digest of the token's digest (it names the token without
    revealing it), ``EXPIRES`` a Unix time of this server's clock, ``MAC`` an
    HMAC-SHA256 of both. So a session survives a restart of the server (the page
    reconnects without asking again), ends when its token leaves the tokens file
    (its ``WHO`` is no longer known), and cannot be made up or extended without
    the key. Logging out ends every session of that token opened until then: the
    token's ``WHO`` is kept with the greatest ``EXPIRES`` logged out, and every
    cookie of it expiring no later is refused. That is one entry per token of the
    tokens file, whatever the number of logouts, kept in ``logouts`` (a file of
    the data directory, replaced whole and fsynced) so a restart does not bring a
    logged-out cookie back; without a file, in memory only.
    """

    def __init__(self, key: bytes, auth: BearerAuth | None, *, session_s: int = SESSION_S,
                 logouts: Path | None = None) -> None:
        self._key = key
        self.session_s = session_s
        entries = auth.entries() if auth is not None else []
        self._who = [self._sign(b"who", digest) for digest, _ in entries]
        self._patterns = {who: patterns for who, (_, patterns) in zip(self._who, entries, strict=True)}
        self._logouts_path = logouts
        self._logged_out: dict[str, int] = _read_logouts(logouts, set(self._who))

    def _sign(self, label: bytes, data: bytes) -> str:
        mac = hmac.new(self._key, label + b"\0" + data, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii")[:32]

    def open(self, index: int) -> str:
        """A cookie value for the token at ``index`` of the tokens file (expiring after every logged-out one)."""
        who = self._who[index]
        expires = max(int(time.time()) + self.session_s, self._logged_out.get(who, 0) + 1)
        body = f"{expires}.{who}"
        return f"{body}.{self._sign(b'cookie', body.encode())}"

    def find(self, cookie_header: str | None) -> _Session | None:
        value = _cookie(cookie_header)
        if value is None:
            return None
        expires, _, rest = value.partition(".")
        who, _, mac = rest.partition(".")
        if not hmac.compare_digest(mac.encode(), self._sign(b"cookie", f"{expires}.{who}".encode()).encode()):
            return None
        if not expires.isdigit() or int(expires) <= time.time() or who not in self._patterns:
            return None
        if int(expires) <= self._logged_out.get(who, 0):
            return None
        return _Session(self._patterns[who])

    def close(self, cookie_header: str | None) -> bool:
        """Log out: this cookie's token's sessions opened until now are refused from now on, across restarts.

        Returns False, changing nothing, for a cookie that is not a live session (none, forged, expired, or
        logged out already).
        """
        value = _cookie(cookie_header)
        if value is None or self.find(cookie_header) is None:
            return False
        who = value.split(".")[1]
        # Every cookie of this token made until now expires no later than now + session_s.
        self._logged_out[who] = max(self._logged_out.get(who, 0), int(time.time()) + self.session_s)
        if self._logouts_path is not None:
            _write_logouts(self._logouts_path, self._logged_out)
        return True


def _read_logouts(path: Path | None, known: set[str]) -> dict[str, int]:
    """The logouts kept in ``path``, for the tokens still in the tokens file (a damaged file: refused)."""
    if path is None or not path.exists():
        return {}
    try:
        kept = json.loads(path.read_text(encoding="ascii"))
        if not isinstance(kept, dict) or not all(isinstance(v, int) for v in kept.values()):
            raise ValueError("not an object of integers")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument("dashboard", f"{path} is not a logouts file ({exc}); delete it to forget "
                              "the logouts (their sessions end at their expiry anyway)") from None
    return {who: expires for who, expires in kept.items() if who in known}


def _write_logouts(path: Path, logged_out: dict[str, int]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        json.dump(logged_out, file, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def session_key(path: Path) -> bytes:
    """The key that signs session cookies: read from ``path``, or made (random, mode 0600) on first use."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != 32:
            raise InvalidArgument("dashboard", f"{path} is not a 32-byte key (delete it: a new one is made)") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as file:
        file.write(key)
        file.flush()
        os.fsync(file.fileno())
    return key


def _cookie(header: str | None) -> str | None:
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and 0 < len(value) <= 100:
            return value
    return None


@dataclass(eq=False)
class _Subscriber:
    sink: StreamSink
    view: View
    done: asyncio.Future[None]
    stable: Any = None


@dataclass
class Dashboard:
    """The ``/ui/`` pages of one server (see the module docstring).

    ``error`` turns an exception into the server's problem answer; ``connections``
    counts the server's open connections (None: unknown).
    """

    leases: Any
    store: Any
    store_writer: Any
    auth: BearerAuth | None
    cluster_id: str
    lock_delay_ms: int | None
    error: Callable[[Exception, Request], Response]
    connections: Callable[[], int | None]
    sessions: Sessions
    streams_max: int = STREAMS_MAX
    secure: bool = False
    tick_s: float = TICK_S
    show_health: bool = True  # False: a viewer of another process (stockade ui), whose health is not this one's
    _subs: set[_Subscriber] = field(default_factory=set)
    _ticker: asyncio.Task[None] | None = None
    _marker: Any = None
    _resync_at: float = 0.0
    _built: dict[View, tuple[Any, float, dict[str, Any]]] = field(default_factory=dict)
    _latency: dict[str, Latency] = field(default_factory=lambda: {"coordinator": Latency(), "store": Latency()})

    @staticmethod
    def owns(request: Request) -> bool:
        """Whether the request is the dashboard's: a path under ``/ui/``, or a browser's ``GET /`` without a token."""
        if request.raw_path.startswith(PREFIX) or request.raw_path == "/ui":
            return True
        return (request.raw_path == "/" and request.method == "GET" and "authorization" not in request.headers
                and "text/html" in request.headers.get("accept", ""))

    def dispatch(self, request: Request) -> Response | Awaitable[Response]:
        try:
            result = self._route(request)
        except Exception as exc:  # noqa: BLE001 - every error becomes a problem document
            return self.error(exc, request)
        if isinstance(result, Response):
            return _marked(result)
        return self._finish(result, request)

    async def _finish(self, pending: Awaitable[Response], request: Request) -> Response:
        try:
            return _marked(await pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            return self.error(exc, request)

    def _route(self, request: Request) -> Response | Awaitable[Response]:
        path, method = request.raw_path, request.method
        if path in ("/", "/ui"):
            return Response(303, b"", None, [("Location", PREFIX)])
        rest = path[len(PREFIX):]
        if rest == "session":
            return self._session(request)
        if rest == "api/session":  # answered to anyone: whether this page must ask for a token first
            query(request, ())
            return json_response(200, self._whoami(request))
        if method != "GET":
            raise Problem("method-not-allowed", f"{method} not allowed", [("Allow", "GET")])
        if rest == "" or rest.startswith("scope/"):
            scope = validate_scope(segment(rest[len("scope/"):], "scope")) if rest else ""
            query(request, ())
            return _page(scope)
        if rest.startswith("static/"):
            return _static(rest[len("static/"):])
        patterns = self._viewer(request)
        if rest == "api/state":
            return self._state(view_of(query(request, ("q", "page", "scope")), patterns))
        if rest == "events":
            return self._events(view_of(query(request, ("q", "page", "scope")), patterns))
        if rest.startswith("api/timeline/"):
            scope = validate_scope(segment(rest[len("api/timeline/"):], "scope"))
            query(request, ())
            if patterns is not None and not scope_allowed(scope, patterns):
                return problem("unauthorized", "this session does not cover the scope", status=403)
            return self._timeline(scope)
        raise Problem("not-found", "no such page")

    # -- auth ----------------------------------------------------------------------------------

    def _viewer(self, request: Request) -> tuple[str, ...] | None:
        """The scope patterns the request may see (None: every scope); 401 without a session or token."""
        if self.auth is None:
            return None
        if "authorization" in request.headers:
            known, patterns = self.auth.reach(request.headers["authorization"])
            if known:
                return patterns
        else:
            session = self.sessions.find(request.headers.get("cookie"))
            if session is not None:
                return session.patterns
        raise Problem("unauthorized", "log in: POST /ui/session with a bearer token of the tokens file")

    def _whoami(self, request: Request) -> dict[str, Any]:
        if self.auth is None:
            return {"auth": False, "logged_in": True, "limited": False}
        try:
            patterns = self._viewer(request)
        except Problem:
            return {"auth": True, "logged_in": False, "limited": False}
        return {"auth": True, "logged_in": True, "limited": patterns is not None}

    def _session(self, request: Request) -> Response:
        query(request, ())
        if request.body:
            raise Problem("invalid-argument", "the token goes in the Authorization header; the body must be empty")
        if request.method == "DELETE":  # log out; the browser forgets the cookie either way
            forget = [("Set-Cookie", f"{COOKIE}=; {self._cookie_flags()}; Max-Age=0")]
            if self.auth is not None and not self.sessions.close(request.headers.get("cookie")):
                raise Problem("unauthorized", "no session to log out (not logged in, or logged out already)", forget)
            return Response(204, headers=forget)
        if request.method != "POST":
            raise Problem("method-not-allowed", f"{request.method} not allowed", [("Allow", "POST, DELETE")])
        if self.auth is None:
            return Response(204)  # nothing to log in to
        index = self.auth.index_of(request.headers.get("authorization"))
        if index < 0:
            raise Problem("unauthorized", "not a token of the tokens file")
        value = self.sessions.open(index)
        cookie = f"{COOKIE}={value}; {self._cookie_flags()}; Max-Age={int(self.sessions.session_s)}"
        return Response(204, headers=[("Set-Cookie", cookie)])

    def _cookie_flags(self) -> str:
        return "Path=/ui; HttpOnly; SameSite=Strict" + ("; Secure" if self.secure else "")

    # -- data ----------------------------------------------------------------------------------

    def _health(self) -> dict[str, Any]:
        return {"connections": self.connections(), "leases": self.leases.leases,
                "waiters": len(self.leases.waiters), "streams": len(self._subs), "streams_max": self.streams_max,
                "streams_dropped": int(DROPPED.value()),
                "stream_backlog_bytes": max((sub.sink.sink_buffered() for sub in self._subs), default=0),
                "commit": {file: latency.read(file) for file, latency in self._latency.items()}}

    async def _document(self, view: View, health: dict[str, Any] | None = None) -> dict[str, Any]:
        """The view's snapshot; one built less than a tick ago, with nothing changed since, is reused
        (a crowd of pages opening or reconnecting at once costs one build, not one each)."""
        marker, now = self._marker_now(), time.monotonic()
        cached = self._built.get(view)
        if marker is not None and cached is not None and cached[0] == marker and now - cached[1] < self.tick_s:
            return cached[2]
        if view.patterns is None and health is None and self.show_health:
            health = self._health()
        document = await snapshot(self.leases, self.store, view, cluster=self.cluster_id,
                                  lock_delay_ms=self.lock_delay_ms, health=health)
        if marker is not None:
            if len(self._built) >= BUILT_MAX:
                self._built.clear()
            self._built[view] = (marker, now, document)
        return document

    async def _state(self, view: View) -> Response:
        return json_response(200, await self._document(view))

    async def _timeline(self, scope: str) -> Response:
        events = [(event, "coordinator") for event in await self.leases.history(scope, HISTORY_PER_SCOPE)]
        if self.store.path is not None:  # stockade ui on a coordinator without a store file beside it: none
            refused = await asyncio.to_thread(rejections, self.store.path, scope, REJECTIONS_PER_SCOPE)
            events += [(event, "store") for event in refused]
        events.sort(key=lambda pair: (pair[0].at_unix_ms, pair[1] == "store", pair[0].seq))  # as history sorts
        from stockade.timeline import journal_events, render_fragment  # on use, as `_file`'s imports

        page = render_fragment(journal_events(events), until_ms=time.time_ns() // 1_000_000, wall_clock=True,
                               newest_first=True, empty=f"No events recorded for {scope}.")
        return Response(200, page.encode(), "text/html; charset=utf-8")

    # -- live updates --------------------------------------------------------------------------

    def _events(self, view: View) -> Response:
        if len(self._subs) >= self.streams_max:
            raise Problem("backend-unavailable", f"{self.streams_max} dashboard streams are open (the bound); retry",
                          [("Retry-After", "1")])

        async def run(sink: StreamSink) -> None:
            if len(self._subs) >= self.streams_max:  # several were admitted in one loop turn
                sink.sink_write(b"event: busy\ndata: {}\n\n")
                return
            sub = _Subscriber(sink, view, asyncio.get_running_loop().create_future())
            self._subs.add(sub)
            if self._ticker is None or self._ticker.done():
                self._ticker = asyncio.get_running_loop().create_task(self._tick())
            try:
                sink.sink_write(b"retry: 1000\n\n")
                document = await self._document(view)
                self._send(sub, _frame(document), stable_part(document))
                await sub.done
            finally:
                self._subs.discard(sub)

        return Stream(run, "text/event-stream; charset=utf-8")

    def _marker_now(self) -> Any:
        """What moves when something the page shows changes (None: unknown, so every tick builds snapshots)."""
        if not isinstance(self.leases, LeaseService):
            return None  # --coordinator: others change the backend without this server seeing it
        return self.leases.committer.ops, len(self.leases.waiters), self.store_writer.ops

    async def _tick(self) -> None:
        busy_s = 0.0
        while self._subs:
            await asyncio.sleep(max(self.tick_s, DUTY_FACTOR * busy_s))
            started = time.monotonic()
            marker, now = self._marker_now(), started
            resync = now >= self._resync_at
            busy_s = 0.0
            if marker is not None and marker == self._marker and not resync:
                continue
            self._marker = marker
            if resync:
                self._resync_at = now + RESYNC_S
            health = self._health() if self.show_health else None
            groups: dict[View, list[_Subscriber]] = {}
            for sub in self._subs:
                groups.setdefault(sub.view, []).append(sub)
            for view, subs in groups.items():
                document = await self._document(view, health)
                stable, frame = stable_part(document), _frame(document)  # encoded once for every stream of the view
                for sub in subs:
                    if resync or sub.stable != stable:
                        self._send(sub, frame, stable)
            busy_s = time.monotonic() - started

    def _send(self, sub: _Subscriber, frame: bytes, stable: Any) -> None:
        if sub.done.done():
            return
        if sub.sink.sink_buffered() > STREAM_BUFFER_BYTES_MAX:
            DROPPED.inc()
            sub.done.set_result(None)  # the page reconnects and starts again from a fresh snapshot
            return
        sub.stable = stable
        if not sub.sink.sink_write(frame):
            sub.done.set_result(None)

    def close(self) -> None:
        """End every stream (the server is stopping)."""
        for sub in list(self._subs):
            if not sub.done.done():
                sub.done.set_result(None)
        if self._ticker is not None:
            self._ticker.cancel()


def _frame(document: dict[str, Any]) -> bytes:
    return f"event: snapshot\ndata: {json.dumps(document, separators=(',', ':'))}\n\n".encode()


def _marked(response: Response) -> Response:
    response.route = "dashboard"
    response.headers = [*(response.headers or ()), *_HEADERS]
    return response


def _static(name: str) -> Response:
    content_type = _STATIC.get(name)
    if content_type is None:
        raise Problem("not-found", "no such file")
    return Response(200, _file(name), content_type)


_files: dict[str, bytes] = {}


def _file(name: str) -> bytes:
    if name not in _files:
        # On use: a server (a host process) that never serves /ui/ loads neither (importlib.resources alone
        # brings tempfile, shutil, bz2 and lzma).
        from importlib import resources

        from stockade.timeline import CSS as TIMELINE_CSS

        # The timeline's sheet is `stockade.timeline.CSS` itself, the one the report files inline: one source.
        _files[name] = (TIMELINE_CSS.encode() if name == "timeline.css" else
                        resources.files("stockade.server").joinpath("static", name).read_bytes())
    return _files[name]


def _page(scope: str) -> Response:
    title = f"{scope} · stockade" if scope else "stockade"
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><link rel=icon href='data:,'>"
        "<link rel=stylesheet href=/ui/static/timeline.css><link rel=stylesheet href=/ui/static/dashboard.css></head>"
        f"<body data-scope='{html.escape(scope, quote=True)}'><noscript>This page needs JavaScript; "
        "stockade status and stockade history show the same in a terminal.</noscript>"
        "<script src=/ui/static/dashboard.js></script></body></html>"
    )
    return Response(200, body.encode(), "text/html; charset=utf-8")
