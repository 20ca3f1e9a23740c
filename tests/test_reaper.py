"""A test process that is killed does not leave its servers running (src/stockade/testing/servers/reaper.py).

A child Python process plays the test process: it starts a real Redis through
the fixtures' helper (which registers it with the watcher) and a plain
``sleep`` it does not register (the control), prints both pids, and waits.
This test then kills it with SIGKILL, so none of its own cleanup runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.testing.servers import reaper
from stockade.testing.servers.redis import require_redis

TESTS = Path(__file__).parent
GONE_WITHIN_S = 60.0  # a bound for a busy machine; the watcher acts as soon as it reads end-of-file

_CHILD = """
import json, subprocess, sys, time
from pathlib import Path
from stockade.testing.servers.redis import RedisServer
server = RedisServer(Path(sys.argv[1]))
control = subprocess.Popen(["sleep", "600"])
print(json.dumps({"redis": server.process.pid, "control": control.pid}), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    return reaper.start_time(pid) is None or Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_test_process_leaves_no_server_behind(tmp_path: Path) -> None:
    require_redis()
    path = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "redis")], stdout=subprocess.PIPE,
                             text=True, cwd=TESTS, env={**os.environ, "PYTHONPATH": path})
    assert child.stdout is not None
    pids = json.loads(child.stdout.readline())
    try:
        assert not _gone(pids["redis"]) and not _gone(pids["control"])
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        assert _wait_gone(pids["redis"]), "the registered Redis outlived its killed test process"
        # The control: a process nobody registered is still there (the watcher ends only what it was given).
        assert not _gone(pids["control"])
    finally:
        for pid in pids.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait(30)


def _watcher_reads(lines: str) -> int:
    """Run a watcher that reads ``lines`` and then end-of-file (its test process ended); its exit status."""
    watcher = subprocess.Popen([sys.executable, reaper.__file__], stdin=subprocess.PIPE)
    watcher.communicate(lines.encode(), timeout=30)
    return watcher.returncode


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait(30)


def test_the_watcher_never_signals_a_reused_pid(bystander: subprocess.Popen[bytes]) -> None:
    """A registered pid whose start time differs (the pid was reused) is left alone."""
    began = reaper.start_time(bystander.pid)
    assert began is not None
    assert _watcher_reads(f"+{bystander.pid} {began + 1}\n") == 0
    assert bystander.poll() is None
    # The same line with the right start time ends it (the check above could have failed).
    assert _watcher_reads(f"+{bystander.pid} {began}\n") == 0
    assert bystander.wait(30) == -signal.SIGKILL


def test_an_unwatched_pid_is_left_alone(bystander: subprocess.Popen[bytes]) -> None:
    began = reaper.start_time(bystander.pid)
    assert _watcher_reads(f"+{bystander.pid} {began}\n-{bystander.pid}\n") == 0
    assert bystander.poll() is None


def test_a_watched_file_lists_servers_other_processes_started(bystander: subprocess.Popen[bytes],
                                                             tmp_path: Path) -> None:
    """``@path``: the processes listed in the file when the test process ends are ended too (a run's shared
    servers, started by its workers); a reused pid in it is left alone, as with ``+``."""
    began = reaper.start_time(bystander.pid)
    assert began is not None
    listed = tmp_path / "pids.json"
    listed.write_text(json.dumps([[bystander.pid, began + 1]]))
    assert _watcher_reads(f"@{listed}\n@{tmp_path / 'missing.json'}\n") == 0
    assert bystander.poll() is None  # the control: a start time that differs
    listed.write_text(json.dumps([[bystander.pid, began]]))  # read at the end, not when registered
    watcher = subprocess.Popen([sys.executable, reaper.__file__], stdin=subprocess.PIPE)
    assert watcher.stdin is not None
    watcher.stdin.write(f"@{listed}\n".encode())
    watcher.stdin.flush()
    assert bystander.poll() is None
    watcher.stdin.close()
    assert watcher.wait(30) == 0
    assert bystander.wait(30) == -signal.SIGKILL


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range(monkeypatch):
    import socket

    from stockade.testing.servers import ports

    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    drawn = ports.free_ports(8)
    assert len(set(drawn)) == 8
    if low - ports.POOL_MIN >= 1_000:  # where the host leaves room below its range (this one: 32768)
        assert all(ports.POOL_MIN <= port < low for port in drawn), drawn
    for port in drawn:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: nothing holds it
    # Control: where the range cannot be read, the kernel's ports (from its ephemeral range) as before.
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", "/nonexistent")
    assert all(port >= low for port in ports.free_ports(4))
