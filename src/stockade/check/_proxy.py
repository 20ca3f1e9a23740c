"""A TCP proxy on loopback that can hold what one worker sends to the resource, for the delayed-request case.

The worker's resource url is rewritten to point at the proxy (`proxied_url`);
the proxy forwards both directions byte for byte. `HoldProxy.hold` makes it
keep every byte the worker sends from then on (on any of its connections);
`HoldProxy.wait_held` returns once the first of them arrived (the request left
the worker); `HoldProxy.release` forwards them, in order, and passes through
again. Nothing is parsed: the same proxy delays a PostgreSQL statement, a Redis
script call or an HTTP request.

Bounded: at most `HELD_BYTES_MAX` bytes held; every socket closed by `close`.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit, urlunsplit

from stockade.resources.registry import DEFAULT_PORTS

__all__ = ["HoldProxy", "proxied_url", "DEFAULT_PORTS"]

HELD_BYTES_MAX = 16 * 1024 * 1024
_CHUNK = 65536


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


class HoldProxy:
    """Forward 127.0.0.1:`port` to ``upstream``; hold the client's bytes between `hold` and `release`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._state = threading.Condition()
        self._holding = False
        self._held: list[tuple[socket.socket, bytes]] = []
        self._held_bytes = 0
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="check-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                return
            with self._state:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(_CHUNK):
                if not from_client:  # answers are never held (and never wait on the lock)
                    sink.sendall(data)
                    continue
                with self._state:
                    if self._holding and self._held_bytes + len(data) <= HELD_BYTES_MAX:
                        self._held.append((sink, data))
                        self._held_bytes += len(data)
                        self._state.notify_all()
                        continue
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

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

    def close(self) -> None:
        with self._state:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass
