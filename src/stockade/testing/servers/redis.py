"""A real ``redis-server`` 7 for the tests: a free loopback port, a temporary directory, AOF on.

Started as ``redis-server --bind 127.0.0.1 --port P --dir D --daemonize no
--appendonly yes --appendfsync always --save ''`` and stopped by its pid
(SIGTERM, or SIGKILL for the crash tests). `RedisServer.restart` starts the
same directory again, on the same port, so it loads its AOF.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT_S = 30.0
STOP_TRIES = 40  # SIGTERMs, 0.5 s apart, before SIGKILL


def require_redis() -> None:
    """Skip without redis-server, except under CI, where a missing server is a failure."""
    if not os.path.exists(REDIS_SERVER):
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (scripts/test.sh installs it)")
        pytest.skip("redis-server is not installed")


class RedisServer:
    """One redis-server process over ``directory``; ``extra`` are more command-line options."""

    def __init__(self, directory: Path, *, appendfsync: str = "always", extra: tuple[str, ...] = ()) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.appendfsync = appendfsync
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory),
            "--daemonize", "no", "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "",
            "--protected-mode", "no", *self.extra,
        ]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        reaper.watch(self.process.pid)  # ended if this test process is killed
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.01)
        raise RuntimeError(f"redis-server on {self.port} did not come up: {self.log_tail()}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")  # not -LOADING: the AOF is in
        except OSError:
            return False

    def log_tail(self) -> str:
        try:
            return (self.directory / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """kill -9, and wait for it to be gone."""
        if self.process is not None:
            self.signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            # Redis refuses a SIGTERM while it writes its first AOF (a replica after its sync): ask again.
            for _ in range(STOP_TRIES):
                self.signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                self.signal(signal.SIGKILL)
                self.process.wait()
            self.process = None
