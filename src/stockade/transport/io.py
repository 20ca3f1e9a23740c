"""The hand-written twins every generated one stands on: how to sleep, wait, spawn, schedule and block.

Everything else with a sync and an async face (the client, each backend's port)
is written once, async, in an ``_async/`` folder, and its ``_sync/`` sibling is
generated from it by ``scripts/unasync.py`` (a test checks that the generated
files are current). The generator renames ``AsyncIO`` to
``SyncIO``; these two classes give both sides the same vocabulary.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from stockade.transport import workers
from stockade.transport.timer import TimerEntry, call_later
from stockade.transport.workers import Job

if TYPE_CHECKING:  # the sync side never loads asyncio or ssl: each ``AsyncIO`` call imports asyncio as it runs
    import asyncio
    import ssl

__all__ = [
    "AsyncIO", "SyncIO", "AsyncTCPStream", "TCPStream", "AsyncBodyGuard", "BodyGuard", "AsyncHandle", "Handle",
    "unix_address", "Flag",
]

T = TypeVar("T")


async def _awaited(function: Callable[[], Awaitable[T]]) -> T:
    return await function()


class AsyncIO:
    """asyncio: tasks for background work, worker threads for blocking calls."""

    @staticmethod
    async def sleep(seconds: float) -> None:
        import asyncio
        await asyncio.sleep(seconds)

    @staticmethod
    def event() -> asyncio.Event:
        import asyncio
        return asyncio.Event()

    @staticmethod
    async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout_s`` passes; True if set.

        Not ``asyncio.wait_for``: on 3.11 it returns when the event is set and drops a cancellation
        that arrives in the same step, so a cancelled keepalive could go on renewing.
        """
        import asyncio
        if event.is_set():
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        return event.is_set()

    @staticmethod
    def submit(function: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
        """Run ``function`` in the background, in a task of its own (tasks are cheap); `join` waits for it."""
        import asyncio
        return asyncio.get_running_loop().create_task(function(), name=name)  # type: ignore[arg-type]

    @staticmethod
    def hand_off(callback: Callable[[], None]) -> asyncio.Task[None] | None:
        """Run the user's ``callback`` (``on_lost``, a hook): here, now, on the loop; None: nothing to `join`."""
        callback()
        return None

    @staticmethod
    def call_later(delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """Run the short ``callback`` on this loop after ``delay_s``; the handle's ``cancel()`` stops it."""
        import asyncio
        return asyncio.get_running_loop().call_later(delay_s, callback)

    @staticmethod
    async def join(handle: asyncio.Task[None]) -> None:
        import asyncio
        if handle is not asyncio.current_task():
            await asyncio.gather(handle, return_exceptions=True)

    @staticmethod
    async def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        import asyncio
        return await asyncio.to_thread(function, *args, **kwargs)

    @staticmethod
    def run_now(function: Callable[[], Awaitable[T]]) -> T:
        """Run ``function`` to its end now, blocking the caller, on a loop of its own in a thread of its own.

        For the few reads a handle does in one blocking round trip: when it is opened outside a running
        loop (its cluster id, as the sync client reads it), or one blocking by contract (a server's
        verify keys). Inside a running loop it blocks that loop, as any blocking call would; the async
        source so never imports its generated sync twin.
        """
        outcome: list[Any] = []

        def run() -> None:
            import asyncio
            try:
                outcome.append((asyncio.run(_awaited(function)), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                outcome.append((None, exc))

        thread = threading.Thread(target=run, name="stockade-run-now", daemon=True)
        thread.start()
        thread.join()
        result, error = outcome[0]
        if error is not None:
            raise error
        return result

    @staticmethod
    def loop_running() -> bool:
        """True when called from inside a running event loop, where nothing may block."""
        import asyncio
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @staticmethod
    def body_guard() -> AsyncBodyGuard:
        return AsyncBodyGuard()

    @staticmethod
    async def open_tcp(
        host: str, port: int, *, tls: ssl.SSLContext | None, timeout_s: float
    ) -> AsyncTCPStream:
        """Connect within ``timeout_s``; raises `OSError` (`TimeoutError` included)."""
        import asyncio
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls is not None else None
            )
        _tune(writer.get_extra_info("socket"))
        return AsyncTCPStream(reader, writer)

    @staticmethod
    async def open_unix(path: str, *, timeout_s: float) -> AsyncTCPStream:
        """Connect to the Unix-domain socket ``path`` within ``timeout_s``; raises `OSError` as `open_tcp`."""
        import asyncio
        with unix_address(path) as address:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_unix_connection(address)
        return AsyncTCPStream(reader, writer)


_FLAG_CONDITIONS = threading.Lock()  # held while a `Flag` gets its condition, and by a `set` that finds none


class Flag:
    """A `threading.Event` (``is_set``, ``set``, ``clear``, ``wait``, the same behaviour) whose condition is
    made by the first ``wait`` that has to block, not with the flag: the sync client makes two a lease,
    and a lease released before its keepalive starts never waits on them."""

    # Class defaults, no ``__init__``: a new flag costs no call.
    _flag: bool = False
    _cond: threading.Condition | None = None

    def is_set(self) -> bool:
        return self._flag

    def _condition(self) -> threading.Condition | None:
        """The condition, made now; None if the flag was set while none existed (nothing to wait for)."""
        with _FLAG_CONDITIONS:
            if self._cond is None:
                if self._flag:
                    return None
                self._cond = threading.Condition(threading.Lock())
            return self._cond

    def set(self) -> None:
        cond = self._cond
        if cond is None:
            with _FLAG_CONDITIONS:  # a waiter that makes the condition after this sees the flag under it
                cond = self._cond
                if cond is None:
                    self._flag = True
                    return
        with cond:
            self._flag = True
            cond.notify_all()

    def clear(self) -> None:
        cond = self._cond
        if cond is None:
            with _FLAG_CONDITIONS:
                cond = self._cond
                if cond is None:
                    self._flag = False
                    return
        with cond:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        cond = self._cond or self._condition()
        if cond is None:
            return True
        with cond:
            signaled: bool = self._flag
            if not signaled:
                signaled = cond.wait(timeout)
            return signaled


class SyncIO:
    """Threads: background work on a few shared threads (`stockade.transport.workers`); blocking calls run in place."""

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    event = Flag  # ``SyncIO.event()`` makes a `Flag`, without a call in between

    @staticmethod
    def wait_event(event: Flag, timeout_s: float | None) -> bool:
        return event.wait(timeout_s)

    @staticmethod
    def submit(function: Callable[[], None], name: str) -> Job:
        """Run ``function`` on one of the process's few keepalive threads (`stockade.transport.workers`),
        never a thread of its own; `join` waits for it, or withdraws it if it has not started."""
        return workers.keepalives().submit(function, withdrawable=True)

    @staticmethod
    def hand_off(callback: Callable[[], None]) -> Job | None:
        """Run the user's ``callback`` (``on_lost``, a hook) on the process's callback thread, so that a slow
        one delays no renewal and no deadline; `join` waits until it ran."""
        return workers.callbacks().submit(callback, withdrawable=False)

    @staticmethod
    def call_later(delay_s: float, callback: Callable[[], None]) -> TimerEntry:
        """Run the short ``callback`` on the process's timer thread after ``delay_s``; ``cancel()`` stops it."""
        return call_later(delay_s, callback)

    @staticmethod
    def join(handle: Job) -> None:
        handle.join()  # a no-op on the job's own thread

    @staticmethod
    def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return function(*args, **kwargs)

    @staticmethod
    def run_now(function: Callable[[], T]) -> T:
        return function()

    @staticmethod
    def loop_running() -> bool:
        return False  # blocking is what the sync client does

    @staticmethod
    def body_guard() -> BodyGuard:
        return BodyGuard()

    @staticmethod
    def open_tcp(host: str, port: int, *, tls: ssl.SSLContext | None, timeout_s: float) -> TCPStream:
        """Connect within ``timeout_s``; raises `OSError` (`TimeoutError` included)."""
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            _tune(sock)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        return TCPStream(sock)

    @staticmethod
    def open_unix(path: str, *, timeout_s: float) -> TCPStream:
        """Connect to the Unix-domain socket ``path`` within ``timeout_s``; raises `OSError` as `open_tcp`."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            with unix_address(path) as address:
                sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return TCPStream(sock)


#: The longest socket path connected to as it is (``sun_path`` holds 108 bytes with its NUL on Linux).
UNIX_PATH_BYTES_MAX = 100


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """``path``, or for a longer one the same socket through ``/proc/self/fd/N/NAME`` (its directory held open)."""
    if len(os.fsencode(path)) <= UNIX_PATH_BYTES_MAX:
        yield path
        return
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{os.path.basename(path)}"
    finally:
        os.close(directory)


class AsyncBodyGuard:
    """Cancels the task that runs a ``lock()`` body when the body's lease is lost.

    Armed while the body runs. `interrupt` may be called from any thread (the
    lease is marked lost at its deadline, by a renewal, or by a reader of ``lost``); the cancel
    is delivered on the task's loop. When the body's `CancelledError` reaches
    the ``lock()`` block, `caused` tells it apart from a cancellation from
    outside, as ``asyncio.timeout`` does: it withdraws its own request with
    ``uncancel()``, and reports True only if no other request is pending.
    """

    def __init__(self) -> None:
        import asyncio
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._armed = False
        self._requested = False

    def arm(self) -> None:
        self._armed = True

    def interrupt(self, cause: str) -> None:
        if self._task is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._cancel(cause)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel, cause)

    def _cancel(self, cause: str) -> None:
        if self._armed and not self._requested and self._task is not None and not self._task.done():
            self._requested = True
            self._task.cancel(f"stockade: lease lost: {cause}")

    def disarm(self, exc: BaseException | None) -> bool:
        """Stop interrupting; True if ``exc`` is the cancellation this guard requested, and the only one."""
        import asyncio
        self._armed = False
        if not self._requested or self._task is None:
            return False
        self._requested = False
        others = self._task.uncancel()
        return isinstance(exc, asyncio.CancelledError) and others == 0


class BodyGuard:
    """The sync twin of `AsyncBodyGuard`: a thread cannot be interrupted safely, so it never is.

    The sync client reports a loss through ``lease.lost``, ``on_lost`` and
    `raise_if_lost` (docs/leases.md) instead.
    """

    def arm(self) -> None:
        pass

    def interrupt(self, cause: str) -> None:
        pass

    def disarm(self, exc: BaseException | None) -> bool:
        return False


class AsyncHandle:
    """A handle that ``await handle`` (or ``async with handle``) finishes opening.

    `stockade.connect_async` returns at once, without I/O, from inside a
    running loop; the first ``await`` (or use) fetches what the handle needs.
    """

    async def _open(self) -> None:
        raise NotImplementedError

    async def _opened(self) -> Any:
        await self._open()
        return self

    def __await__(self) -> Any:
        return self._opened().__await__()


class Handle:
    """The sync twin of `AsyncHandle`: a sync handle is open when it is returned."""

    def _open(self) -> None:
        raise NotImplementedError


def _tune(sock: Any) -> None:
    """Small requests go out at once (no Nagle delay); dead peers are noticed by TCP keepalive."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except (OSError, AttributeError):
        pass  # not a TCP socket (a test double); nothing to tune


class AsyncTCPStream:
    """A connected byte stream for the async HTTP client. Every call takes a timeout.

    Raises `OSError` on failure: `TimeoutError` when the time ran out,
    `ConnectionError` when the peer went away.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, data: bytes, timeout_s: float) -> None:
        import asyncio
        self._writer.write(data)
        # A small request leaves in write() itself; only a backlog needs the loop.
        if self._writer.transport.get_write_buffer_size():
            async with asyncio.timeout(timeout_s):
                await self._writer.drain()

    async def receive(self, bytes_max: int, timeout_s: float) -> bytes:
        """Up to ``bytes_max`` bytes; ``b""`` when the peer closed the connection."""
        import asyncio
        async with asyncio.timeout(timeout_s):
            return await self._reader.read(bytes_max)

    def is_stale(self) -> bool:
        """True if an idle connection was closed by the peer (or sent something unasked)."""
        return self._writer.is_closing() or self._reader.at_eof() or bool(len(self._reader._buffer))  # type: ignore[attr-defined]  # asyncio has no public peek

    def close(self) -> None:
        self._writer.close()


class TCPStream:
    """A connected byte stream for the sync HTTP client. Every call takes a timeout.

    Raises `OSError` on failure: `TimeoutError` when the time ran out,
    `ConnectionError` when the peer went away.

    A plain socket (TCP or Unix, not TLS) is kept non-blocking and waited on with
    one ``poll`` object: a request leaves in one ``send`` call and an answer is one
    ``poll`` and one ``recv``, with no mode switch around them. A TLS socket sets
    its timeout before each call instead.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._poll: Any = None
        if type(sock) is socket.socket and hasattr(select, "poll"):
            sock.setblocking(False)
            self._poll = select.poll()
            self._poll.register(sock, select.POLLIN)

    def send(self, data: bytes, timeout_s: float) -> None:
        if self._poll is not None:
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]  # the socket's buffer is full: wait for room, then back to non-blocking
            self._sock.settimeout(timeout_s)
            try:
                self._sock.sendall(data)
            finally:
                self._sock.setblocking(False)
            return
        self._sock.settimeout(timeout_s)
        self._sock.sendall(data)

    def receive(self, bytes_max: int, timeout_s: float) -> bytes:
        """Up to ``bytes_max`` bytes; ``b""`` when the peer closed the connection."""
        poll = self._poll
        if poll is None:
            self._sock.settimeout(timeout_s)
            return self._sock.recv(bytes_max)
        end_s = time.monotonic() + timeout_s
        while True:
            if not poll.poll(max(0.0, timeout_s) * 1000):
                raise TimeoutError("timed out")
            try:
                return self._sock.recv(bytes_max)
            except BlockingIOError:  # woken with nothing to read after all: wait for the rest of the time
                timeout_s = end_s - time.monotonic()

    def is_stale(self) -> bool:
        """True if an idle connection was closed by the peer (or sent something unasked)."""
        try:
            if self._poll is not None:
                return bool(self._poll.poll(0))
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
