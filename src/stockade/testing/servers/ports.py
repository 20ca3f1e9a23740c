"""Free loopback ports for the servers a test starts, drawn where no outgoing connection can take them.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from its ephemeral range, the range every
outgoing connection of every process on the host draws its local port from too: between the check and the
server's own bind, a client's connection may take it ("address already in use", seen once in a full test
run on 2 cores). These ports are drawn at random below that range (from `POOL_MIN`), where only a
listening server can hold one, and each is checked free by a bind; where the range leaves no room below it
(or cannot be read), they come from the kernel as before.
"""

from __future__ import annotations

import random
import socket

__all__ = ["POOL_MIN", "free_port", "free_ports"]

#: The lowest port drawn (below the ephemeral range, whose low end is usually 32768).
POOL_MIN = 10_000
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_POOL_SIZE_MIN = 1_000  # a pool smaller than this: the kernel's ports instead
_TRIES_PER_PORT = 64
_draw = random.SystemRandom()


def _pool() -> range | None:
    """The ports below the ephemeral range, from `POOL_MIN`; None when that is too small or not known."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(POOL_MIN, low) if low - POOL_MIN >= _POOL_SIZE_MIN else None


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that nothing is bound to now (all held until all are found)."""
    pool = _pool()
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            for attempt in range(_TRIES_PER_PORT + 1):
                sock = socket.socket()
                try:
                    sock.bind(("127.0.0.1", _draw.choice(pool) if pool and attempt < _TRIES_PER_PORT else 0))
                except OSError:
                    sock.close()
                    continue
                held.append(sock)
                break
            else:
                raise OSError(f"no free loopback port after {_TRIES_PER_PORT + 1} tries")
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    """One loopback port that nothing is bound to now (`free_ports`)."""
    return free_ports(1)[0]
