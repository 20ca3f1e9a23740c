"""The host's coordinator process of a coordinator file (``sqlite:///coord.db``, the default): its paths and start.

One process per host owns the file (it claims ``coord.db.lock`` exclusively, as
``stockade serve`` does: the single-writer rule is unchanged) and serves the
lease API on a Unix-domain socket beside it; the clients of that url reach it
there, so a client that freezes holds no lock of the file, only its leases
(which end with their TTL). It is ``stockade serve --host-file coord.db``,
started by the first client that finds no live socket, in a session of its own
(it survives that client), and it exits once it has had no lease, no waiter and
no connection for ``--idle-exit-s`` (default `IDLE_EXIT_S`).

Beside ``coord.db``:

- ``coord.db.sock``: its socket, mode 0600 (owner only);
- ``coord.db.host/`` (mode 0700): ``start.lock``, held (``flock``) by whoever
  starts the process or lets it exit, so two clients starting at once start one
  process and none starts one while another is exiting; ``log``, the process's
  stdout and stderr; and the server's own ``store.db`` and ``dashboard.key``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from stockade.core.errors import BackendUnavailable
from stockade.transport.io import SyncIO, unix_address

__all__ = ["IDLE_EXIT_S", "OPEN_ELSEWHERE", "START_TIMEOUT_S", "socket_path", "host_dir", "start_lock_path",
           "start_host_process", "stop_host_process", "host_process_pid", "try_start_lock"]

#: How long the process stays up with no lease, no waiter and no connection (seconds).
IDLE_EXIT_S = 30.0
#: How long a client waits for a process it started to accept connections (a loaded host imports slowly).
START_TIMEOUT_S = 30.0
_POLL_S = 0.01
_PROBE_TIMEOUT_S = 1.0


def socket_path(file: Path) -> Path:
    """``coord.db.sock``: where the host process of ``file`` listens."""
    return file.with_name(file.name + ".sock")


def host_dir(file: Path) -> Path:
    """``coord.db.host/``: the host process's start lock, log and server files."""
    return file.with_name(file.name + ".host")


def start_lock_path(file: Path) -> Path:
    return host_dir(file) / "start.lock"


def _private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailable(f"cannot create {directory}: {exc.strerror or exc}", certain_no_effect=True) from exc


def _open_lock(file: Path) -> int:
    _private_dir(host_dir(file))
    try:
        return os.open(start_lock_path(file), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BackendUnavailable(f"cannot open {start_lock_path(file)}: {exc.strerror or exc}",
                                 certain_no_effect=True) from exc


def try_start_lock(file: Path) -> int | None:
    """The start lock of ``file``'s host process, taken without waiting (the process's idle exit); None if held."""
    fd = _open_lock(file)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _answers(sock: Path) -> bool:
    try:
        SyncIO.open_unix(str(sock), timeout_s=_PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def _lock_within(fd: int, deadline: float, file: Path) -> bool:
    """Take the start lock (True), or return False as soon as the socket answers meanwhile (started by the
    holder of the lock, which may be frozen before letting it go)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if _answers(socket_path(file)):
                return False
            if time.monotonic() >= deadline:
                raise BackendUnavailable(f"the host process of {file} is being started or stopped by another "
                                         f"process for over {START_TIMEOUT_S:g} s", certain_no_effect=True) from None
            time.sleep(_POLL_S)


def start_host_process(file: Path, *, idle_exit_s: float | None = None, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start the host process of ``file`` unless one answers on its socket; return once one does.

    Under the start lock: a process that answers is used as it is; otherwise one
    is spawned (``python -m stockade serve --host-file FILE``, a new session,
    stdin from /dev/null, stdout and stderr to ``coord.db.host/log``) and
    waited for until it accepts a connection.

    Raises:
        BackendUnavailable: it exited first (the file is open in embedded processes, or not a
            coordinator file: the last line of its log says which), or did not answer within ``timeout_s``.
    """
    file = file.absolute()
    idle_exit_s = IDLE_EXIT_S if idle_exit_s is None else idle_exit_s
    deadline = time.monotonic() + timeout_s
    fd = _open_lock(file)
    try:
        sock = socket_path(file)
        if not _lock_within(fd, deadline, file) or _answers(sock):
            return
        _refuse_if_open_elsewhere(file)
        log_path = host_dir(file) / "log"
        with open(log_path, "ab") as log:
            os.fchmod(log.fileno(), 0o600)
            command = [sys.executable, "-m", "stockade", "serve", "--host-file", str(file),
                       "--idle-exit-s", f"{idle_exit_s:g}", "--log-level", "warning"]
            env = _child_env()
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                    start_new_session=True, close_fds=True, cwd=str(file.parent))
        while not _answers(sock):
            if proc.poll() is not None:
                _refuse_if_open_elsewhere(file)  # opened in between: say so as before the start
                raise BackendUnavailable(f"the host process of {file} exited at start ({proc.returncode}): "
                                         f"{_last_line(log_path)}", certain_no_effect=True)
            if time.monotonic() >= deadline:
                raise BackendUnavailable(f"the host process of {file} did not answer within {timeout_s:g} s "
                                         f"(log: {log_path})", certain_no_effect=True)
            time.sleep(_POLL_S)
        # Reaped when it exits, so that it is never left a zombie of this client.
        threading.Thread(target=proc.wait, name="stockade-host-reaper", daemon=True).start()
    finally:
        os.close(fd)


def _child_env() -> dict[str, str]:
    """The host process's environment: this client's, without ``$STOCKADE_COORDINATOR`` (it serves the file),
    and with ``$PYTHONPATH``'s relative entries made absolute (it runs in the file's directory: ``PYTHONPATH=src``
    would otherwise import another stockade there, or none)."""
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_COORDINATOR"}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


#: What a client is told when the file is open in other processes and its host process cannot own it.
OPEN_ELSEWHERE = ("{file} is open in other processes that write it themselves (sqlite:///…?process=embedded, "
                  "the default of older versions) or served by a stockade serve, so its host process cannot own "
                  "it: open it as they do (add ?process=embedded, or use the server's http:// url), or stop them")


def _refuse_if_open_elsewhere(file: Path) -> None:
    """Raise `BackendUnavailable` if another process holds ``coord.db.lock`` (an embedded user's shared claim, a
    server's exclusive one): the host process would exit at start. Nothing waits; nothing is left held."""
    try:
        fd = os.open(f"{file}.lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return  # no claim file yet (a new file), or unreadable: the process says why if it cannot start
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise BackendUnavailable(OPEN_ELSEWHERE.format(file=file), certain_no_effect=True) from None
    finally:
        os.close(fd)  # closing releases the probe's claim at once


def host_process_pid(file: Path) -> int | None:
    """The pid of the process listening on ``file``'s socket (the socket's peer credentials, Linux), or None."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.settimeout(_PROBE_TIMEOUT_S)
        with unix_address(str(socket_path(file.absolute()))) as address:
            sock.connect(address)
        pid: int = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    except (OSError, AttributeError, struct.error):  # none answers, or no SO_PEERCRED (not Linux)
        return None
    finally:
        sock.close()
    return pid


def stop_host_process(file: Path, *, timeout_s: float = START_TIMEOUT_S) -> bool:
    """SIGTERM the host process of ``file`` and wait until it has let the file go (its ``coord.db.lock`` claim
    ends with it), so that the next client starts a new one: a restart of the coordinator. False if none answered.

    Raises:
        BackendUnavailable: it still holds the file after ``timeout_s``.
    """
    file = file.absolute()
    pid = host_process_pid(file)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while _claimed(file):
        if time.monotonic() >= deadline:
            raise BackendUnavailable(f"the host process of {file} (pid {pid}) did not stop within {timeout_s:g} s")
        time.sleep(_POLL_S)
    return True


def _claimed(file: Path) -> bool:
    """Whether some process holds ``coord.db.lock`` (the probe's own claim is let go at once)."""
    try:
        _refuse_if_open_elsewhere(file)
    except BackendUnavailable:
        return True
    return False


def _last_line(log_path: Path) -> str:
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 2000))
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1][:500] if lines else "(empty log)"
