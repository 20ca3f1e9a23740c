"""The life of a server process: one event loop, its signals, the ready callback.

`run` keeps the loop running from before the signal handlers are installed to
the end of the close, in one ``run_until_complete``. It used to run the loop
twice, for the start and then for the serving, with the handlers installed and
``ready`` called in between, while the loop was not running. uvloop listens to
its signal wakeup pipe only while it runs, and a signal that arrived in that
gap (as when a supervisor sends SIGTERM the instant it reads "listening on")
was recorded and never acted on: the server went on serving, 20 of 100 times
(`tests/test_serve_signals.py`, whose control keeps the old order).

Runs on uvloop when it is installed (the ``server`` extra), else on asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from stockade.server.app import Server, ServerConfig

#: The signals that stop a server cleanly: it stops accepting, ends its connections, commits, exits 0.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run(config: ServerConfig, *, ready: Callable[[Server], None] | None,
        server_class: Callable[[ServerConfig], Server]) -> int:
    """Run a server (of ``server_class``) until SIGTERM or SIGINT (uvloop when installed).

    ``ready(server)`` is called once the server listens, with its signal
    handlers in place and its loop running: a stop signal sent from then on
    is acted on. A signal that arrives during startup is kept: the server
    closes as soon as its start ends, and ``ready`` is not called.

    Returns:
        0, or `stockade.server.app.EXIT_COMMIT_FAILED` when it stopped because a
        coordinator commit failed.
    """
    try:
        import uvloop
    except ImportError:  # optional: the server works on the standard loop, somewhat slower
        uvloop = None  # type: ignore[assignment]
    loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = server_class(config)
    try:
        loop.run_until_complete(_serve(server, ready))
    finally:
        loop.close()
    return server.exit_status


async def _serve(server: Server, ready: Callable[[Server], None] | None) -> None:
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:  # first: from here a signal sets the server's stop event, never lost
        loop.add_signal_handler(signum, server.stop)
    await server.start()
    if ready is not None and not server.stopping:
        ready(server)
    await server.serve_until_stopped()
