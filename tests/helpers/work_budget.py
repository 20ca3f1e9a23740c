"""Count the work of one operation (a lock cycle, a fenced write) in-process: what the budgets are checked against.

Counts, not times (a shared host's noise is not in them):

- ``commits`` and ``wal_frames``: read from the ``-wal`` file itself. Checkpointing
  is held off (``wal_autocheckpoint=0``) for the run, so every frame a commit
  wrote is still there; a frame whose header names a database size is a commit,
  and with ``synchronous=FULL`` each commit is one fdatasync of the WAL.
- ``wal_bytes``: the frames' bytes (page and header).
- ``statements``: SQL statements run on the file's connection (``set_trace_callback``).
- ``log_appends``, ``log_bytes``, ``folds``: a server's record log (``coord.log``): frames appended (one
  fdatasync each), their bytes, and folds into the file (its counters, `RecordLog`).
- ``calls``: Python and C function calls on the thread that serves (``sys.setprofile``),
  the server's event loop thread: a lone request is committed there too.
- ``blocks``: memory blocks allocated and still held, over the run (tracemalloc).

A `Meter` measures one file; `served` runs a `stockade serve` server in a thread of this process.
"""

from __future__ import annotations

import asyncio
import sqlite3
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WAL_HEADER_BYTES = 32
_FRAME_HEADER_BYTES = 24


def wal_frames(path: Path) -> tuple[int, int, int]:
    """``(frames, commits, frame bytes)`` valid in ``path``'s ``-wal`` now (the frames of the current salt)."""
    try:
        data = Path(f"{path}-wal").read_bytes()
    except FileNotFoundError:
        return 0, 0, 0
    if len(data) < _WAL_HEADER_BYTES:
        return 0, 0, 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    frame_bytes = _FRAME_HEADER_BYTES + page_size
    frames = commits = 0
    offset = _WAL_HEADER_BYTES
    while offset + frame_bytes <= len(data):
        header = data[offset:offset + _FRAME_HEADER_BYTES]
        if header[8:16] != salts:
            break
        frames += 1
        if struct.unpack(">I", header[4:8])[0] != 0:
            commits += 1
        offset += frame_bytes
    return frames, commits, frames * frame_bytes


@dataclass
class Work:
    """What ``ops`` operations cost, in total; `per_op` divides."""

    ops: int
    commits: int = 0
    wal_frames: int = 0
    wal_bytes: int = 0
    statements: int = 0
    calls: int = 0
    log_appends: int = 0
    log_bytes: int = 0
    folds: int = 0
    blocks: int = 0
    sql: list[str] = field(default_factory=list)

    def per_op(self, name: str) -> float:
        return getattr(self, name) / self.ops


class Meter:
    """Counts statements on ``conn`` and frames in ``path``'s WAL between `start` and `stop`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, log: Any = None) -> None:
        self.path = path
        self.conn = conn
        self.log = log  # the file's record log (`RecordLog`), if it has one: its appends, bytes and folds count too
        self.sql: list[str] = []
        self._log_before = (0, 0, 0)

    def hold_checkpoints(self) -> None:
        self.conn.execute("PRAGMA wal_autocheckpoint=0")

    def start(self) -> None:
        self._before = wal_frames(self.path)
        self._log_before = self._log_counts()
        self.sql = []
        self.conn.set_trace_callback(self.sql.append)

    def stop(self, work: Work) -> Work:
        self.conn.set_trace_callback(None)
        after = wal_frames(self.path)
        if after[0] < self._before[0]:
            raise AssertionError(f"the WAL of {self.path} was restarted during the run: held checkpoints failed")
        work.wal_frames += after[0] - self._before[0]
        work.commits += after[1] - self._before[1]
        work.wal_bytes += after[2] - self._before[2]
        work.statements += len(self.sql)
        work.sql += self.sql
        appends, written, folds = (now - before for now, before in zip(self._log_counts(), self._log_before,
                                                                        strict=True))
        work.log_appends += appends
        work.log_bytes += written
        work.folds += folds
        return work

    def _log_counts(self) -> tuple[int, int, int]:
        log = self.log
        return (0, 0, 0) if log is None else (log.appends, log.bytes_written, log.folds)


class CallCounter:
    """Counts function calls (Python and C) on the threads it is installed on."""

    def __init__(self) -> None:
        self.calls = 0
        self.on = False

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and (event == "call" or event == "c_call"):
            self.calls += 1


def calls_of(step: Callable[[], Any], times: int) -> int:
    """The function calls (Python and C) this thread makes running ``step`` ``times`` times."""
    counter = CallCounter()
    sys.setprofile(counter.profile)
    counter.on = True
    try:
        for _ in range(times):
            step()
    finally:
        counter.on = False
        sys.setprofile(None)
    return counter.calls


@dataclass
class Served:
    """A `stockade serve` server running in a thread of this process."""

    url: str
    server: Any
    loop: asyncio.AbstractEventLoop
    counter: CallCounter

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop thread and return its result."""
        async def call() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def coordinator_meter(self) -> Meter:
        records = self.server.leases.file
        return Meter(records.path, records._conn, self.server.leases.log)

    def store_meter(self) -> Meter:
        store = self.server.store_writer._run_batch.__self__.store
        return Meter(store.path, store._conn)


@contextmanager
def served(data_dir: Path, **config: Any) -> Iterator[Served]:
    """Start a server on a free port in a thread; its loop thread counts calls while ``counter.on``. ``config``:
    more `ServerConfig` fields."""
    from stockade.server import Server, ServerConfig

    counter = CallCounter()
    ready: dict[str, Any] = {}
    started = threading.Event()

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = Server(ServerConfig(data_dir=data_dir, port=0, **config))
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting test
            ready["error"] = exc
            started.set()
            return
        ready.update(server=server, loop=loop)
        sys.setprofile(counter.profile)
        started.set()
        try:
            loop.run_until_complete(server.serve_until_stopped())
        finally:
            sys.setprofile(None)
            loop.close()

    thread = threading.Thread(target=main, name="work-budget-server", daemon=True)
    thread.start()
    started.wait(30)
    if "error" in ready:
        raise ready["error"]
    server, loop = ready["server"], ready["loop"]
    try:
        yield Served(server.url, server, loop, counter)
    finally:
        loop.call_soon_threadsafe(server.stop)
        thread.join(30)
