"""A ``stockade serve`` whose signal arrives at a chosen moment, for tests/test_serve_signals.py.

    python serve_signals.py ORDER MOMENT DATA_DIR

ORDER is ``run`` (`stockade.server._lifetime.run`, which ``stockade serve`` runs) or
``old-order`` (the control: the order `run` had before, the loop run twice,
handlers installed and ready called while it is stopped). MOMENT says when the
test's signal reaches the process, made certain rather than left to timing:

- ``ready``: while ``ready`` runs. SIGTERM and SIGINT are blocked from the
  first line (so in every thread the server starts, which inherit the mask);
  ready prints its line, waits until the test's signal is pending, then
  unblocks it in the main thread alone, so it is delivered there, inside
  ready, before ready returns.
- ``start``: during the server's start, the same way: "starting" goes out,
  and the start goes on once the signal has been delivered.

Prints the ready line as ``stockade serve`` does; the exit status is `run`'s.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from stockade.server import Server, ServerConfig

STOP = {signal.SIGTERM, signal.SIGINT}
WAIT_S = 60  # for the test's signal; the test sends it as soon as it reads the line


def _signal_arrives_now(line: str) -> None:
    print(line, flush=True)
    deadline = time.monotonic() + WAIT_S
    while not (signal.sigpending() & STOP) and time.monotonic() < deadline:
        time.sleep(0.002)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)  # delivered here, before this returns


def ready(server: Server) -> None:
    if MOMENT == "ready":
        _signal_arrives_now(f"stockade serve: listening on {server.url}")
    else:
        print(f"stockade serve: listening on {server.url}", flush=True)


class StartingServer(Server):
    async def start(self) -> None:
        if MOMENT == "start":
            _signal_arrives_now("starting")
        await super().start()


def old_order(config: ServerConfig) -> int:
    """`stockade.server.app.run` as it was: handlers and ready between two runs of the loop."""
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    server = StartingServer(config)
    try:
        loop.run_until_complete(server.start())
        for signum in STOP:
            loop.add_signal_handler(signum, server.stop)
        ready(server)
        loop.run_until_complete(server.serve_until_stopped())
    finally:
        loop.close()
    return server.exit_status


if __name__ == "__main__":
    ORDER, MOMENT, DATA_DIR = sys.argv[1:4]
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    config = ServerConfig(data_dir=Path(DATA_DIR), port=0)
    if ORDER == "old-order":
        sys.exit(old_order(config))
    from stockade.server import _lifetime

    sys.exit(_lifetime.run(config, ready=ready, server_class=StartingServer))
