"""Start, restart or stop a `stockade serve` kept in HOME (its data in HOME/data, its pid in HOME/pid).

What a user's ``--coordinator-restart`` command would do with their own server:

    python tests/helpers/serve_restart.py start HOME PORT
    python tests/helpers/serve_restart.py restart HOME PORT [--fresh]
    python tests/helpers/serve_restart.py stop HOME

``restart`` ends the server by its pid (SIGTERM, SIGKILL after 10 s), starts it
again on the same port and data, and returns once ``/healthz`` answers.
``--fresh`` is the control of tests/test_check.py: the data directory is moved
aside and the server comes back on an empty one (a new cluster: its tokens
start again, and the resource's marks are gone with the old store). The server
runs in its own session, its output in HOME/serve.log; nothing but the pid in
HOME/pid is ever signalled, and only while its start time is the one recorded beside it (pids come round).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from stockade.testing.servers.reaper import start_time

READY_S = 30


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(home: Path) -> None:
    try:
        pid, began = (int(field) for field in (home / "pid").read_text().split())
    except (OSError, ValueError):
        return
    if _alive(pid) and start_time(pid) == began:  # the same process, not one that took its pid since
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    (home / "pid").unlink(missing_ok=True)


def start(home: Path, port: int) -> None:
    (home / "data").mkdir(parents=True, exist_ok=True)
    with open(home / "serve.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "stockade", "serve", "--data-dir", str(home / "data"),
                                    "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    (home / "pid").write_text(f"{process.pid} {start_time(process.pid)}")
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"stockade serve exited {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"stockade serve not ready after {READY_S} s")


def main(argv: list[str]) -> None:
    action, home = argv[0], Path(argv[1])
    if action == "stop":
        stop(home)
        return
    port = int(argv[2])
    if action == "restart":
        stop(home)
        if "--fresh" in argv:
            (home / "data").rename(home / f"data.{time.monotonic_ns()}")
    start(home, port)


if __name__ == "__main__":
    main(sys.argv[1:])
