"""Servers a killed test process leaves behind are ended by a watcher.

The fixtures start real servers (PostgreSQL, etcd, ZooKeeper, Redis) and stop
them when the tests end. A test process that is killed (SIGKILL, a CI job's
timeout, an OOM kill) runs none of that, and its servers would keep their
ports, memory and temporary directories until someone ends them by hand.

`watch(pid)` registers a server with one watcher process per test process
(started on first use). The watcher holds the read end of a pipe whose write
end only the test process holds; however the test process ends, the kernel
closes that end, the watcher reads end-of-file, and it sends SIGKILL to every
process still registered, then exits. A process is identified by its pid and
its start time (`/proc/<pid>/stat`), so a pid reused by an unrelated process
is never signalled. `unwatch(pid)` drops a server the fixture stopped itself.
`watch_file(path)` registers servers that other processes start: when the
test process ends, the watcher also ends every process listed in the JSON file
at ``path`` (``[[pid, start time], ...]``, read then; a missing file lists none).

The watcher runs in its own session: a Ctrl-C sent to the terminal's process
group reaches the tests (which stop their servers themselves), not it.

    python src/stockade/testing/servers/reaper.py    # the watcher; lines on stdin: "+<pid> <start>" or "-<pid>"
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

__all__ = ["watch", "unwatch", "watch_file", "start_time"]

_lock = threading.Lock()
_watcher: subprocess.Popen[bytes] | None = None
_owner_pid = 0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def _send(line: str) -> None:
    global _watcher, _owner_pid
    with _lock:
        if _watcher is None or _owner_pid != os.getpid():  # a forked child starts its own
            _watcher = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
            _owner_pid = os.getpid()
        assert _watcher.stdin is not None
        try:
            _watcher.stdin.write(line.encode() + b"\n")
            _watcher.stdin.flush()
        except OSError:  # the watcher is gone (killed by hand): nothing more to do for it
            pass


def watch(pid: int) -> None:
    """End ``pid`` (SIGKILL) if this process ends before `unwatch(pid)`."""
    began = start_time(pid)
    if began is not None:
        _send(f"+{pid} {began}")


def unwatch(pid: int) -> None:
    """Forget ``pid`` (its fixture stopped it)."""
    _send(f"-{pid}")


def watch_file(path: str) -> None:
    """End (SIGKILL) every process listed in the JSON file ``path`` when this process ends: the servers of a run
    that processes other than this one start and record there."""
    _send(f"@{path}")


def _listed(path: str) -> dict[int, int]:
    """The ``[[pid, start time], ...]`` of the JSON file ``path``; none if it is missing or malformed."""
    import json

    try:
        with open(path, "rb") as f:
            return {int(pid): int(began) for pid, began in json.load(f)}
    except (OSError, ValueError, TypeError):
        return {}


def _main() -> int:
    watched: dict[int, int] = {}
    files: list[str] = []
    for raw in sys.stdin.buffer:  # until the test process's end of the pipe closes
        line = raw.decode("ascii", "replace").strip()
        try:
            if line.startswith("+"):
                pid, began = line[1:].split()
                watched[int(pid)] = int(began)
            elif line.startswith("-"):
                watched.pop(int(line[1:]), None)
            elif line.startswith("@"):
                files.append(line[1:])
        except ValueError:
            continue
    for path in files:
        watched.update(_listed(path))
    for pid, began in watched.items():
        if start_time(pid) == began:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(_main())
