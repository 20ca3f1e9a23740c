"""``stockade serve --host-file coord.db``: the listener of the host's coordinator process of one file.

The server is the usual one (its lease table in memory, ``coord.db`` claimed
exclusively, group commits); this module gives it what the host process needs
beside (`stockade.coordinators.sqlite._host` names the paths and starts it):

- `bind_host_socket`: a Unix-domain socket at ``coord.db.sock``, mode 0600. It is
  bound under a temporary name, given its mode, then renamed over the final
  name, so no client ever sees it with a wider mode, and a socket left by a
  process that was killed is replaced atomically. Only called once the file
  is claimed exclusively: no other host process of it is alive.
- `peer_of`: the peer of a Unix connection is its process (``SO_PEERCRED``), so the
  fair shares of `stockade.server._guard` count per client process, as they count
  per address over TCP.
- `watch_idle`: the idle exit. Once the server has had no lease, no waiter and no
  connection for ``idle_exit_s``, it takes the start lock (not waiting: a client
  starting it meanwhile keeps it up), removes its socket (a new client then starts
  a new process, which waits on the start lock until this one is gone) and stops.
  The start lock is let go only when the process has closed the file.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from stockade.coordinators.sqlite._host import socket_path, try_start_lock
from stockade.transport.io import unix_address

__all__ = ["bind_host_socket", "peer_of", "watch_idle", "IDLE_CHECK_S_MAX"]

#: The idle check runs at least this often (seconds).
IDLE_CHECK_S_MAX = 1.0


def bind_host_socket(file: Path, backlog: int) -> socket.socket:
    """A listening Unix socket at ``socket_path(file)``, mode 0600 from the moment it has that name."""
    final = socket_path(file)
    temporary = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        with unix_address(str(temporary)) as address:
            sock.bind(address)
        os.chmod(temporary, 0o600)
        os.replace(temporary, final)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_of(sock: socket.socket | None) -> str:
    """``pid N``: the process at the other end of a Unix connection (``SO_PEERCRED``); "" if unknown."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return ""
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return ""
    return f"pid {pid}"


async def watch_idle(file: Path, idle_exit_s: float, idle: Callable[[], bool],
                     stop: Callable[[int | None], None]) -> None:
    """Call ``stop(start_lock_fd)`` once ``idle()`` has held for ``idle_exit_s`` and the start lock is free;
    ``stop(None)`` at the first idle check after the file's directory is removed (a temporary directory: no
    client can reach this process again, and taking the start lock would create the directory anew)."""
    since = time.monotonic()
    while True:
        await asyncio.sleep(min(IDLE_CHECK_S_MAX, idle_exit_s / 4))
        if not idle():
            since = time.monotonic()
            continue
        if not file.parent.is_dir():
            stop(None)
            return
        if time.monotonic() - since < idle_exit_s:
            continue
        fd = try_start_lock(file)
        if fd is None:  # a client is starting it: it is wanted
            since = time.monotonic()
            continue
        try:  # no await since `idle()` held: no connection was accepted in between
            os.unlink(socket_path(file))
        except FileNotFoundError:
            pass
        stop(fd)
        return
