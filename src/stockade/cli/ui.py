"""``stockade ui``: the dashboard of ``stockade serve`` (docs/dashboard.md), served locally for any coordinator.

The coordinator is --url (http://HOST:PORT of a `stockade serve`,
sqlite:///PATH/coord.db, postgresql://..., etcd://H1:2379,... or
zookeeper://H1:2181,...), else --data-dir, else $STOCKADE_URL, else the data
directory. The same pages as a server's ``/ui/``, on a local port (default
127.0.0.1:7391), read-only: a local file is read read-only (nothing is created,
as ``stockade status`` reads it), any other coordinator through its client,
which only lists scopes and reads journals. The scopes are read again every
second (`TICK_S`), the first `SCAN_SCOPES_MAX` (10,000) in name order, and
shown busiest first; a scope's page reads that one scope by name (any scope);
high-water marks come from the store beside a local coord.db (or --store-file),
or, for a server, from its ``/v1/hwm`` (the page's scopes only, a second late).
A server with --auth-tokens wants $STOCKADE_AUTH_TOKEN; this page itself asks
for no login (bind it to loopback, the default). Neither the health nor the
rejection counts of another process are known here: open the server's own
dashboard for those.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stockade.cli._common import add_data_dir, add_url, coordinator_url, fail, help_text, is_remote, local_file, refuse
from stockade.cli._readonly import (
    check_store_file,
    read_contenders,
    read_coordinator,
    read_high_waters,
    read_history,
    read_scope,
)
from stockade.clock import SystemClock
from stockade.core.errors import StockadeError
from stockade.core.journal import HistoryEvent
from stockade.core.leases import Contender, ScopeInfo

__all__ = ["run", "UI_PORT", "TICK_S"]

UI_PORT = 7391
TICK_S = 1.0  # each tick lists the coordinator's scopes again: gentler than a server's own 250 ms
SCAN_SCOPES_MAX = 10_000  # scopes read per tick (a scope's page reads its one scope by name, past them too)


class UrlLeases:
    """What the dashboard reads, from a coordinator url: scopes page by page and a scope's journal.

    Every read runs in a worker thread, one at a time (the clients are not shared between threads).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.file = local_file(url)
        self._lock = threading.Lock()
        self._coord: Any = None
        self._scopes: list[ScopeInfo] = []
        self.waiters: dict[str, object] = {}  # not known here (the dashboard's health is not shown)
        self.cluster_id = ""

    def open(self) -> None:
        """Connect (or read the file once), so that a bad url fails before the page is served.

        Raises:
            StockadeError: the coordinator cannot be reached or read.
        """
        if self.file is None:
            from stockade.client import connect

            self._coord = connect(self.url)
            self.cluster_id = self._coord.cluster_id or ""
        self._scopes = self._read_scopes()

    def close(self) -> None:
        if self._coord is not None:
            self._coord.close()

    @property
    def leases(self) -> int:
        return sum(1 for info in self._scopes if info.token is not None)

    def _read_scopes(self) -> list[ScopeInfo]:
        with self._lock:
            if self.file is not None:
                snapshot = read_coordinator(self.file, SystemClock().now_ns(), SCAN_SCOPES_MAX)
                self.cluster_id = snapshot.cluster_id
                return list(snapshot.scopes)
            infos: list[ScopeInfo] = []
            while len(infos) < SCAN_SCOPES_MAX:
                page = self._coord.scopes(after=infos[-1].scope if infos else "",
                                         limit=min(200, SCAN_SCOPES_MAX - len(infos)))
                infos += page
                if not page:
                    break
            return infos

    async def list(self, *, after: str, limit: int) -> tuple[Sequence[ScopeInfo], str | None]:
        if not after:  # a new pass: read the coordinator again, once
            self._scopes = await asyncio.to_thread(self._read_scopes)
        names = [info.scope for info in self._scopes]
        start = next((i for i, name in enumerate(names) if name > after), len(names)) if after else 0
        page = self._scopes[start:start + limit]
        more = start + limit < len(self._scopes)
        return page, (page[-1].scope if more and page else None)

    async def inspect(self, scope: str) -> ScopeInfo | None:
        """One scope by name (a scope's page): read-only from a coordinator file (None: no record), else the
        client's `inspect`. One read, whatever the number of scopes."""
        def read() -> ScopeInfo | None:
            with self._lock:
                if self.file is not None:
                    return read_scope(self.file, SystemClock().now_ns(), scope)[0]
                info: ScopeInfo = self._coord.inspect(scope)
                return info

        return await asyncio.to_thread(read)

    async def contenders(self, scope: str, limit: int) -> Sequence[Contender]:
        """The scope's holder and waiters in serving order: read-only from a coordinator file, else the client's."""
        def read() -> Sequence[Contender]:
            with self._lock:
                if self.file is not None:
                    return read_contenders(self.file, SystemClock().now_ns(), scope, limit)[0]
                return list(self._coord.contenders(scope, limit=limit))

        return await asyncio.to_thread(read)

    async def history(self, scope: str, limit: int) -> Sequence[HistoryEvent]:
        def read() -> Sequence[HistoryEvent]:
            with self._lock:
                if self.file is not None:
                    return read_history(self.file, scope, limit)[0]
                return list(self._coord.history(scope, limit=limit))

        return await asyncio.to_thread(read)


class UrlMarks:
    """High-water marks: of a local store file, read whole at each pass, or a server's, asked per scope shown."""

    def __init__(self, url: str, store_file: Path | None) -> None:
        self.path = store_file  # its refusals are on the timelines (None: none known)
        self._marks: dict[str, int] = {}
        self._wanted: set[str] = set()
        self._store: Any = None
        if store_file is None and is_remote(url):
            from stockade.client import open_store

            self._store = open_store(url)

    def high_water(self, scope: str) -> int:
        if scope not in self._marks:
            self._wanted.add(scope)  # read at the next pass; the page shows it a tick later
        return self._marks.get(scope, 0)

    def refresh(self) -> None:
        if self.path is not None:
            self._marks = read_high_waters(self.path)[0]
        elif self._store is not None:
            wanted, self._wanted = list(self._wanted)[:200], set()
            self._marks.update({scope: self._store.high_water(scope) for scope in wanted})

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


async def _serve(leases: UrlLeases, marks: UrlMarks, host: str, port: int, ready: Callable[[str], None]) -> None:
    from stockade.server._dashboard import Dashboard, Sessions
    from stockade.server._http import ConnectionLimits, HttpProtocol, Request, Response, problem

    def error(exc: Exception, request: Request) -> Response:
        if isinstance(exc, StockadeError):
            return problem(exc.code if exc.code != "stockade-error" else "invariant-violation", str(exc)[:200])
        code = getattr(exc, "code", "invariant-violation")
        return problem(code, getattr(exc, "detail", None))

    ui = Dashboard(leases=leases, store=marks, store_writer=None, auth=None, cluster_id=leases.cluster_id,
                   lock_delay_ms=None, error=error, connections=lambda: None,
                   sessions=Sessions(secrets.token_bytes(32), None), tick_s=TICK_S, show_health=False)

    def dispatch(request: Request) -> Response | Any:
        if request.raw_path == "/" or ui.owns(request):
            return ui.dispatch(request) if request.raw_path != "/" else Response(303, headers=[("Location", "/ui/")])
        return problem("not-found", "this viewer serves /ui/ only")

    async def refresh_marks() -> None:
        while True:
            await asyncio.to_thread(marks.refresh)
            await asyncio.sleep(TICK_S)

    loop = asyncio.get_running_loop()
    limits = ConnectionLimits()
    server = await loop.create_server(lambda: HttpProtocol(dispatch, lambda request, response, now: None,
                                                           lambda path: 0, limits), host=host, port=port)
    refresher = loop.create_task(refresh_marks())
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    bound = server.sockets[0].getsockname()
    ready(f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}/ui/")
    try:
        await stop.wait()
    finally:
        ui.close()
        refresher.cancel()
        server.close()
        for conn in list(limits.open):
            conn.abort()
        limits.stop()


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade ui", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_url(parser)
    add_data_dir(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, default=UI_PORT, help=f"port (default {UI_PORT}; 0: any free port)")
    parser.add_argument("--store-file", type=Path, default=None,
                        help="a store file whose marks and refusals to show (default: store.db beside a local "
                             "coord.db)")
    args = parser.parse_args(argv)
    url = coordinator_url(args)
    if url.startswith("memory://"):
        return fail("a memory:// coordinator lives inside one process: nothing else can show it", 2)
    store_file = args.store_file
    local = local_file(url)
    if store_file is None and local is not None and (local.parent / "store.db").is_file():
        store_file = local.parent / "store.db"
    leases = UrlLeases(url)
    try:
        if store_file is not None:
            check_store_file(store_file)
        if local is not None and not local.is_file():
            return fail(f"no coordinator at {local} (use --url, --data-dir, $STOCKADE_URL or $STOCKADE_DATA)")
        leases.open()
        marks = UrlMarks(url, store_file)
    except StockadeError as exc:
        leases.close()
        return refuse(exc)
    except ImportError as exc:
        return fail(f"this coordinator needs its extra: {exc}")
    try:
        asyncio.run(_serve(leases, marks, args.host, args.port,
                           lambda where: print(f"stockade ui: {url.partition('@')[2] or url} on {where}",
                                               flush=True)))
    except OSError as exc:
        return fail(f"cannot serve: {exc}")
    finally:
        marks.close()
        leases.close()
    sys.stdout.flush()
    return 0
