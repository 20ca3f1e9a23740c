"""A TCP proxy on loopback that can hold what a client sends to the resource, for the delayed-request case.

The worker's resource url is rewritten to point at the proxy (`proxied_url`);
the proxy forwards both directions. Two ways to delay:

- the whole stream (any resource): `HoldProxy.hold` makes it keep every byte
  the client sends from then on (on any of its connections);
  `HoldProxy.wait_held` returns once the first of them arrived (the request
  left the worker); `HoldProxy.release` forwards them, in order, and passes
  through again. Nothing is parsed: the same proxy delays a PostgreSQL
  statement, a Redis script call or an HTTP request. This is what
  `stockade check` uses.
- one HTTP request (``http=True``: the upstream is a `stockade serve`): the
  proxy reads the client's side one HTTP/1.1 request at a time (a head, then
  ``Content-Length`` bytes of body; the clients it serves never pipeline nor
  chunk). `HoldProxy.hold_next` arms a `Hold` that catches the next request
  of a method and forwards only a prefix of it at once: nothing (``head``:
  the server has seen nothing of it), the head (``body``: the server parsed
  the request line and headers and waits for the body), or all but the last
  byte of the body (``tail``). `Hold.release` forwards the rest. Every
  request is kept in `HoldProxy.passed` with its timings (`Passed`:
  monotonic ns, the clock every process of the host shares).

Bounded: at most `HELD_BYTES_MAX` bytes held (a stream hold); a request head
of at most `HEAD_BYTES_MAX` and a body of at most `BODY_BYTES_MAX` bytes (a
connection sending more is closed); at most `PASSED_MAX` requests recorded
(later ones are forwarded, not recorded); every socket closed, and every
held request let go, by `close`.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from stockade.core.errors import InvalidArgument
from stockade.resources.registry import DEFAULT_PORTS

__all__ = ["HoldProxy", "Hold", "Passed", "proxied_url", "DEFAULT_PORTS", "MODES"]

HELD_BYTES_MAX = 16 * 1024 * 1024
HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 4 * 1024 * 1024
PASSED_MAX = 10_000
#: Where a `Hold` cuts the request it caught: ``head``, ``body``, ``tail`` (see the module docstring).
MODES = ("head", "body", "tail")
_CHUNK = 65536
CLOSE_JOIN_S = 5.0  # `close` waits this long at most for each connection's thread


def upstream_of(url: str) -> tuple[str, int] | None:
    """The (host, port) a url's requests go to, or None if the proxy cannot stand in between (a socket
    directory, TLS, several hosts)."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or "," in parts.netloc or "host=" in parts.query:
        return None
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return None
    return parts.hostname, port


def proxied_url(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's (user and password kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class Passed:
    """One HTTP request that went through the proxy, with its timings (monotonic ns; 0: not reached)."""

    method: str
    target: str
    held: str | None = None  # the hold mode, when it was held
    first_byte_ns: int = 0  # its request line was read
    received_ns: int = 0  # the whole request is in the proxy
    prefix_sent_ns: int = 0  # a held request's prefix reached the server
    released_ns: int = 0  # a held request was let go
    forwarded_ns: int = 0  # its last bytes were handed to the socket (stamped before: the answer may beat the stamp)
    answered_ns: int = 0  # the first byte of the server's answer came back

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class Hold:
    """An armed hold: catches the next HTTP request whose method is ``method`` (`HoldProxy.hold_next`)."""

    mode: str
    method: str
    caught: threading.Event = field(default_factory=threading.Event)
    request: Passed | None = None
    _released: threading.Event = field(default_factory=threading.Event)

    def wait_caught(self, timeout_s: float) -> Passed:
        """Block until the held request is in the proxy (and its prefix forwarded).

        Raises:
            TimeoutError: no such request arrived within ``timeout_s``.
        """
        if not self.caught.wait(timeout_s) or self.request is None:
            raise TimeoutError(f"no {self.method} request reached the proxy within {timeout_s} s")
        return self.request

    def release(self) -> None:
        """Forward the rest of the held request (idempotent)."""
        self._released.set()


class HoldProxy:
    """Forward 127.0.0.1:`port` to ``upstream``; hold the client's bytes between `hold` and `release`, or (with
    ``http``) one request caught by `hold_next`."""

    def __init__(self, upstream: tuple[str, int], *, http: bool = False) -> None:
        self.upstream = upstream
        self.http = http
        self.passed: list[Passed] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._state = threading.Condition()
        self._holding = False
        self._held: list[tuple[socket.socket, bytes]] = []
        self._held_bytes = 0
        self._armed: Hold | None = None
        self._caught: list[Hold] = []
        self._sockets: list[socket.socket] = [self._listener]
        self._threads: list[threading.Thread] = []  # each connection's two, joined by `close`
        threading.Thread(target=self._accept, daemon=True, name="check-proxy").start()

    @property
    def url(self) -> str:
        """The proxy's ``http://`` url (for an HTTP upstream)."""
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                return
            in_flight: list[Passed] = []  # this connection's requests forwarded and not yet answered, oldest first
            requests = self._requests if self.http else self._pump
            threads = [threading.Thread(target=requests, args=(client, server, in_flight), daemon=True),
                       threading.Thread(target=self._answers, args=(server, client, in_flight), daemon=True)]
            with self._state:  # started under the lock: `close` never joins a thread not yet started
                self._sockets += [client, server]
                self._threads += threads
                for thread in threads:
                    thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, _in_flight: list[Passed]) -> None:
        """The client's bytes, unparsed (held as they come while `hold` is on)."""
        try:
            while data := source.recv(_CHUNK):
                self._send_or_hold(sink, data)
        except OSError:
            pass
        finally:
            _shut(source, sink)

    def _send_or_hold(self, sink: socket.socket, data: bytes) -> None:
        with self._state:
            if self._holding and self._held_bytes + len(data) <= HELD_BYTES_MAX:
                self._held.append((sink, data))
                self._held_bytes += len(data)
                self._state.notify_all()
                return
        sink.sendall(data)

    def _answers(self, source: socket.socket, sink: socket.socket, in_flight: list[Passed]) -> None:
        """The server's bytes back to the client, never held; each chunk times the oldest unanswered request (the
        clients here send one request at a time per connection)."""
        try:
            while data := source.recv(_CHUNK):
                if in_flight:
                    in_flight.pop(0).answered_ns = time.monotonic_ns()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shut(source, sink)

    def _requests(self, source: socket.socket, sink: socket.socket, in_flight: list[Passed]) -> None:
        """The client's side one HTTP request at a time; a request caught by the armed hold waits for its
        release (`_forward`)."""
        reader = source.makefile("rb")
        try:
            while framed := _read_request(reader):
                passed, data = framed
                if len(self.passed) < PASSED_MAX:
                    self.passed.append(passed)
                hold = self._take(passed.method)
                in_flight.append(passed)  # before its last byte leaves: the answer may be back at once
                if hold is not None:
                    self._forward(hold, passed, data, sink)
                else:
                    passed.forwarded_ns = time.monotonic_ns()
                    self._send_or_hold(sink, data)
        except (OSError, ValueError):  # a connection that ended, or a request the proxy cannot frame
            pass
        finally:
            reader.close()
            _shut(source, sink)

    def _forward(self, hold: Hold, passed: Passed, data: bytes, sink: socket.socket) -> None:
        head_bytes = data.index(b"\r\n\r\n") + 4
        cut = {"head": 0, "body": head_bytes, "tail": max(head_bytes, len(data) - 1)}[hold.mode]
        passed.held = hold.mode
        if cut:
            sink.sendall(data[:cut])
        passed.prefix_sent_ns = time.monotonic_ns()
        hold.request = passed
        hold.caught.set()
        hold._released.wait()
        passed.released_ns = passed.forwarded_ns = time.monotonic_ns()
        sink.sendall(data[cut:])

    def hold(self) -> None:
        """From now on keep what the client sends."""
        with self._state:
            self._holding = True

    def wait_held(self, timeout_s: float) -> bool:
        """Whether some bytes are held within ``timeout_s`` (the request left the worker)."""
        with self._state:
            return self._state.wait_for(lambda: bool(self._held), timeout=timeout_s)

    def release(self) -> int:
        """Forward what was held, in order, and pass through again. Returns the number of bytes released."""
        with self._state:
            released = self._held_bytes
            for sink, data in self._held:
                try:
                    sink.sendall(data)
                except OSError:
                    pass
            self._held, self._held_bytes, self._holding = [], 0, False
            return released

    def hold_next(self, mode: str, method: str = "PUT") -> Hold:
        """Arm a hold for the next HTTP ``method`` request (``http`` proxies); at most one is armed at a time.

        Raises:
            InvalidArgument: ``mode`` is not one of `MODES`, the proxy does not frame HTTP, or a hold is armed.
        """
        if mode not in MODES:
            raise InvalidArgument("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
        if not self.http:
            raise InvalidArgument("mode", "a request is held only by a proxy that frames HTTP (http=True)")
        hold = Hold(mode, method)
        with self._state:
            if self._armed is not None:
                raise InvalidArgument("mode", "a hold is already armed")
            self._armed = hold
        return hold

    def disarm(self) -> None:
        """Drop the armed hold, if it caught nothing yet."""
        with self._state:
            self._armed = None

    def _take(self, method: str) -> Hold | None:
        with self._state:
            hold = self._armed
            if hold is None or hold.method != method:
                return None
            self._armed = None
            self._caught.append(hold)
            return hold

    def close(self) -> None:
        """Close every socket and let every held request go (its connection is closed: it reaches no one).

        Then waits (at most `CLOSE_JOIN_S` each) for the connections' threads, so that every record in
        `passed` is complete: a request's last stamp is taken on its thread after its send returned, and
        its answer may have reached the client before that.
        """
        with self._state:
            sockets, self._sockets = self._sockets, []
            caught, self._caught, self._armed = self._caught, [], None
            threads, self._threads = self._threads, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it (close alone does not)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        for hold in caught:
            hold.release()
        for thread in threads:
            thread.join(CLOSE_JOIN_S)

    def __enter__(self) -> HoldProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_request(reader: BinaryIO) -> tuple[Passed, bytes] | None:
    """The next HTTP/1.1 request on ``reader`` (its record and bytes), or None when the client closed between
    requests.

    Raises:
        ValueError: a head over `HEAD_BYTES_MAX`, a body over `BODY_BYTES_MAX`, or a request cut short.
    """
    line = reader.readline(HEAD_BYTES_MAX + 1)
    if not line:
        return None
    first_byte_ns = time.monotonic_ns()
    head = [line]
    while line not in (b"\r\n", b"\n"):
        line = reader.readline(HEAD_BYTES_MAX + 1)
        if not line:
            raise ValueError("the request ended inside its head")
        head.append(line)
        if sum(map(len, head)) > HEAD_BYTES_MAX:
            raise ValueError("request head too large")
    method, _, rest = head[0].decode("latin-1").partition(" ")
    length = 0
    for header in head[1:]:
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if not 0 <= length <= BODY_BYTES_MAX:
        raise ValueError(f"a body of {length} bytes")
    body = reader.read(length) if length else b""
    if len(body) != length:
        raise ValueError("the request ended inside its body")
    passed = Passed(method, rest.partition(" ")[0], first_byte_ns=first_byte_ns, received_ns=time.monotonic_ns())
    return passed, b"".join(head) + body


def _shut(*ends: socket.socket) -> None:
    for end in ends:
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
