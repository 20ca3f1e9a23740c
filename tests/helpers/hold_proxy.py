"""An HTTP-aware TCP proxy on loopback that can hold one request until the test releases it (S05).

The proxy runs its own asyncio loop in a daemon thread and forwards bytes
between a client and one upstream server. It reads the client's side one
HTTP/1.1 request at a time (a head, then ``Content-Length`` bytes of body: the
clients here never pipeline nor chunk), so it knows where each request
starts and ends and can time each one:

- ``received_ns``: the whole request has reached the proxy;
- ``forwarded_ns``: its last byte went to the server;
- ``answered_ns``: the first byte of the server's answer came back.

`HoldProxy.hold_next` arms a `Hold`: the next request whose method matches is
kept back, and only a prefix of it is forwarded at once:

- ``head``: nothing (the server has seen nothing of it);
- ``body``: the head (the server has parsed the request line and headers and
  waits for the body);
- ``tail``: all but the last byte of the body.

`Hold.release` forwards the rest. Every request that passed, held or not, is
kept in `HoldProxy.passed` with its timings (monotonic ns, the clock every
process of the host shares, as the histories use).

Bounded: a request head of at most 64 KiB, a body of at most 4 MiB.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 4 * 1024 * 1024
MODES = ("head", "body", "tail")


class ProxyError(Exception):
    """A request the proxy cannot frame (too large, or not HTTP/1.1 as the clients here send it)."""


@dataclass
class Passed:
    """One request that went through the proxy, with its timings."""

    method: str
    target: str
    held: str | None = None  # the hold mode, when it was held
    first_byte_ns: int = 0
    received_ns: int = 0
    prefix_sent_ns: int = 0  # the held request's prefix reached the server (held requests only)
    released_ns: int = 0
    forwarded_ns: int = 0
    answered_ns: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class Hold:
    """An armed hold: catches the next request whose method is ``method``."""

    mode: str
    method: str
    caught: threading.Event = field(default_factory=threading.Event)
    request: Passed | None = None
    _release: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def wait_caught(self, timeout_s: float) -> Passed:
        """Block until the held request is in the proxy (and its prefix forwarded)."""
        if not self.caught.wait(timeout_s):
            raise TimeoutError(f"no {self.method} request reached the proxy within {timeout_s} s")
        assert self.request is not None
        return self.request

    def release(self) -> None:
        """Forward the rest of the held request (idempotent; a hold that caught nothing is disarmed)."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)


class HoldProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``; see the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.passed: list[Passed] = []
        self._armed: Hold | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hold-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HoldProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        async def shut() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> HoldProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def hold_next(self, mode: str, method: str = "PUT") -> Hold:
        """Arm a hold for the next ``method`` request; at most one is armed at a time."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        hold = Hold(mode, method, _loop=self._loop)
        with self._lock:
            if self._armed is not None:
                raise RuntimeError("a hold is already armed")
            self._armed = hold
        return hold

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def _take(self, method: str) -> Hold | None:
        with self._lock:
            hold = self._armed
            if hold is None or hold.method != method:
                return None
            self._armed = None
            return hold

    # -- the loop's side ---------------------------------------------------------------------

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        self._writers.update((client_writer, server_writer))
        in_flight: list[Passed] = []  # requests forwarded and not yet answered, oldest first
        answers = asyncio.ensure_future(self._answers(server_reader, client_writer, in_flight))
        try:
            await self._requests(client_reader, server_writer, in_flight)
        except (OSError, ProxyError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                await asyncio.wait_for(asyncio.shield(answers), 30)  # the last answer still goes back
            except (TimeoutError, OSError, asyncio.CancelledError):
                answers.cancel()
            for writer in (client_writer, server_writer):
                writer.close()
                self._writers.discard(writer)

    async def _requests(self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
                        in_flight: list[Passed]) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:
                raise ProxyError("request head too large") from exc
            except asyncio.IncompleteReadError:
                return  # the client closed between requests
            first_byte_ns = time.monotonic_ns()
            if len(head) > HEAD_BYTES_MAX:
                raise ProxyError("request head too large")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target = (request_line.split(" ") + ["", ""])[:2]
            length = 0
            for line in header_lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if not 0 <= length <= BODY_BYTES_MAX:
                raise ProxyError(f"body of {length} bytes")
            body = await reader.readexactly(length) if length else b""
            passed = Passed(method, target, first_byte_ns=first_byte_ns, received_ns=time.monotonic_ns())
            self.passed.append(passed)
            data = head + body
            hold = self._take(method)
            if hold is not None:
                await self._held(hold, passed, data, upstream)
            else:
                upstream.write(data)
                await upstream.drain()
            passed.forwarded_ns = time.monotonic_ns()
            in_flight.append(passed)

    async def _held(self, hold: Hold, passed: Passed, data: bytes, upstream: asyncio.StreamWriter) -> None:
        head_bytes = data.index(b"\r\n\r\n") + 4
        cut = {"head": 0, "body": head_bytes, "tail": max(head_bytes, len(data) - 1)}[hold.mode]
        passed.held = hold.mode
        hold._release = asyncio.Event()
        if cut:
            upstream.write(data[:cut])
            await upstream.drain()
        passed.prefix_sent_ns = time.monotonic_ns()
        hold.request = passed
        hold.caught.set()
        await hold._release.wait()
        passed.released_ns = time.monotonic_ns()
        upstream.write(data[cut:])
        await upstream.drain()

    async def _answers(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter,
                       in_flight: list[Passed]) -> None:
        """Copy the server's bytes back; each answer's first byte is timed for the oldest unanswered request.

        Good enough for the clients here (one request at a time per connection): a
        chunk that ends one answer and starts the next is not split.
        """
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            if in_flight:
                in_flight.pop(0).answered_ns = time.monotonic_ns()
            client.write(chunk)
            await client.drain()
