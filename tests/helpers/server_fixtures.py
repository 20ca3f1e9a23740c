"""Start real `stockade serve` processes (or broken controls of it) on free loopback ports."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.testing.servers import reaper

HELPERS = Path(__file__).parent
PYTHON = sys.executable
READY_SECONDS = 20


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), env.get("PYTHONPATH", "")]))
    return env


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    stderr_path: Path

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def logs(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def start_server(data_dir: Path, *args: str, control: str | None = None, port: int = 0,
                 controls: str = "server_controls.py") -> ServerProcess:
    """Run ``stockade serve --port 0`` (or the control ``control`` of the helper file ``controls``) and wait for
    its ready line."""
    data_dir.mkdir(parents=True, exist_ok=True)
    serve_args = ["--data-dir", str(data_dir), "--port", str(port), *args]
    if control is None:
        command = [PYTHON, "-m", "stockade", "serve", *serve_args]
    else:
        command = [PYTHON, str(HELPERS / controls), control, *serve_args]
    stderr_path = data_dir / f"server-{time.monotonic_ns()}.log"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=_env())
    reaper.watch(proc.pid)  # ended if this test process is killed
    deadline = time.monotonic() + READY_SECONDS
    line = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if b"listening on" in line or not line:
                break
        elif proc.poll() is not None:
            break
    if b"listening on" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}\n{stderr_path.read_text(errors='replace')[-3000:]}")
    url = line.decode().strip().rsplit(" ", 1)[-1]
    return ServerProcess(proc, url, data_dir, stderr_path)


def request(url: str, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
            json_body: Any = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request (urllib: no keep-alive state between calls); returns status, headers, body."""
    data = body
    all_headers = dict(headers or {})
    if json_body is not None:
        data = json.dumps(json_body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url + path, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def cluster_id_of(db: Path) -> str:
    """The cluster id a coordinator file stores (what its record log's frames are sealed with), read read-only."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT v FROM meta WHERE k = 'cluster_id'").fetchone()[0])
    finally:
        conn.close()
