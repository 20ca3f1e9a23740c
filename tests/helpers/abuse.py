"""A hostile peer for `stockade serve`: idle, slowloris and half-sent-body connections, kept up.

Usage: ``python abuse.py HOST PORT --idle N --slow N --bodies N --seconds S``.
All sockets are non-blocking in one process (epoll); a connection the server
closes is opened again, so the pressure lasts ``S`` seconds, or until a SIGTERM (once the test has measured
what it wanted under it). Kinds:

- idle: connects and sends nothing;
- slow: sends a request line and then one header byte every 2 s (never ends its headers);
- bodies: sends the headers of a 1 MiB ``PUT`` and half of its body, then nothing.

Prints one JSON line at the end: connections opened, closed by the server, errors.
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import select
import signal
import socket
import time

BODY_BYTES = 1024 * 1024
SLOW_EVERY_S = 2.0


def _raise_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


class Peer:
    def __init__(self, host: str, port: int, token: str | None) -> None:
        self.address = (host, port)
        self.auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        self.epoll = select.epoll()
        self.socks: dict[int, tuple[socket.socket, str, bytearray]] = {}
        self.opened = self.closed = self.errors = 0
        self.half_body = b"x" * (BODY_BYTES // 2)

    def first_bytes(self, kind: str) -> bytes:
        if kind == "slow":
            return b"POST /v1/locks/s/acquire HTTP/1.1\r\nHost: x\r\n"
        if kind == "bodies":
            return (b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\n" + self.auth +
                    b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % BODY_BYTES
                    + self.half_body)
        return b""

    def open(self, kind: str) -> None:
        try:
            sock = socket.socket()
        except OSError:  # out of file descriptors: try again next round
            self.errors += 1
            return
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        code = sock.connect_ex(self.address)
        if code not in (0, errno.EINPROGRESS):
            self.errors += 1
            sock.close()
            return
        self.opened += 1
        self.socks[sock.fileno()] = (sock, kind, bytearray(self.first_bytes(kind)))
        self.epoll.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP)

    def drop(self, fd: int) -> str:
        sock, kind, _ = self.socks.pop(fd)
        try:
            self.epoll.unregister(fd)
        except OSError:
            pass
        sock.close()
        self.closed += 1
        return kind

    def poll(self, timeout: float) -> list[str]:
        """Handle events; return the kinds of the connections the server closed."""
        gone = []
        for fd, event in self.epoll.poll(timeout):
            if fd not in self.socks:
                continue
            sock, kind, out = self.socks[fd]
            if event & (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = b"-"
                except OSError:
                    data = b""
                if not data or event & (select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP):
                    gone.append(self.drop(fd))
                    continue
            if event & select.EPOLLOUT:
                if out:
                    try:
                        sent = sock.send(out)
                        del out[:sent]
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        gone.append(self.drop(fd))
                        continue
                if not out:
                    self.epoll.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
        return gone

    def trickle(self) -> None:
        for sock, kind, _ in list(self.socks.values()):
            if kind == "slow":
                try:
                    sock.send(b"X")
                except OSError:
                    pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--slow", type=int, default=0)
    parser.add_argument("--bodies", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--token", default=None, help="send this bearer token with the bodies")
    args = parser.parse_args()
    wanted = {"idle": args.idle, "slow": args.slow, "bodies": args.bodies}
    _raise_file_limit(sum(wanted.values()) + 256)
    peer = Peer(args.host, args.port, args.token)
    deadline = time.monotonic() + args.seconds
    next_trickle = time.monotonic() + SLOW_EVERY_S
    counts = dict.fromkeys(wanted, 0)
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))  # ends the loop; the line is printed
    print("started", flush=True)
    while time.monotonic() < deadline and not stopped:
        for kind, target in wanted.items():
            for _ in range(min(200, target - counts[kind])):  # at most 200 new per kind per round
                before = len(peer.socks)
                peer.open(kind)
                counts[kind] += len(peer.socks) - before
        for kind in peer.poll(0.05):
            counts[kind] -= 1
        if time.monotonic() >= next_trickle:
            peer.trickle()
            next_trickle += SLOW_EVERY_S
    print(json.dumps({"opened": peer.opened, "closed_by_server": peer.closed, "errors": peer.errors,
                      "open_at_end": len(peer.socks)}), flush=True)


if __name__ == "__main__":
    main()
