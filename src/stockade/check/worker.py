"""The worker process of `stockade check`: one command a line on stdin, one JSON event a line on stdout.

A worker is a real client of the user's coordinator and resource: it takes
leases and writes with their tokens. It keeps the last token it was granted
per scope and writes with it even after its lease is gone, as a zombie does:
that is the point of the check. It reads its next command only when the
orchestrator sends one, so a SIGSTOP between two commands freezes it at a
known place (the command already in the pipe runs when it wakes).

Commands (JSON objects): ``acquire`` (scope, ttl_ms, wait_ms), ``write``
(scope, key, value, op), ``release`` (scope), ``read`` (scope, key),
``reconnect`` (close the coordinator and connect again, after a restart: its
leases are forgotten, its tokens kept), ``reopen`` (close the resource and
open it again, after a restore), ``exit``. Each answers one object with ``ev``
set to ``grant``, ``write``, ``release``, ``read``, ``reconnected`` (with the
coordinator's ``cluster``), ``reopened``, or ``error`` (with ``error``: the
exception's one line).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from stockade.check.targets import open_target
from stockade.core.errors import BackendUnavailable, StockadeError

__all__ = ["serve_commands", "connect_again", "close_quietly"]


def _answer(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


#: How long a reconnect keeps trying a coordinator that is still coming back.
RECONNECT_S = 30.0


def connect_again(coordinator_url: str) -> Any:
    """A new client of the coordinator, retried (bounded) while it refuses connections."""
    import stockade

    deadline = time.monotonic() + RECONNECT_S
    while True:
        try:
            return stockade.connect(coordinator_url)
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def close_quietly(thing: Any) -> None:
    try:
        thing.close()
    except StockadeError:
        pass  # a connection that died with its server


def serve_commands(name: str, coordinator_url: str, resource_url: str, scratch: str, control: str | None) -> int:
    """Run the command loop until ``exit`` or the end of stdin. Returns the exit status."""
    import stockade

    coord = stockade.connect(coordinator_url)  # the first time: a coordinator that is down is an error at once
    target = open_target(resource_url, scratch, coord=coord, control=control)
    leases: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    _answer(ev="ready", worker=name)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            action, scope = command.get("do"), command.get("scope", "")
            try:
                if action == "exit":
                    break
                if action == "acquire":
                    lease = coord.acquire(scope, ttl_ms=command["ttl_ms"], wait_ms=command["wait_ms"],
                                          holder=f"check-{name}")
                    leases[scope], tokens[scope] = lease, lease.token
                    _answer(ev="grant", token=lease.token.value)
                elif action == "write":
                    token = tokens[scope]  # the last one granted, lease lost or not: a zombie believes it leads
                    outcome = target.write(token, scope, command["key"], command["value"], command.get("op"))
                    _answer(ev="write", token=token.value, result=outcome.result, mark=outcome.mark)
                elif action == "release":
                    lease = leases.pop(scope, None)
                    lost = lease is None or lease.lost
                    if lease is not None:
                        try:
                            lease.release()
                        except StockadeError:
                            lost = True
                    _answer(ev="release", lost=lost)
                elif action == "reconnect":
                    leases.clear()  # gone with the old connection; the tokens stay, as a zombie's do
                    close_quietly(coord)
                    coord = connect_again(coordinator_url)
                    _answer(ev="reconnected", cluster=coord.cluster_id)
                elif action == "reopen":
                    close_quietly(target)
                    target = open_target(resource_url, scratch, coord=coord, control=control)
                    _answer(ev="reopened")
                elif action == "read":
                    value, count = target.read(scope, command["key"])
                    _answer(ev="read", value=value, n=count)
                else:
                    _answer(ev="error", error=f"unknown command {action!r}")
            except StockadeError as exc:
                _answer(ev="error", error=f"{type(exc).__name__}: {exc}")
    finally:
        for lease in leases.values():
            try:
                lease.release()
            except StockadeError:
                pass
        close_quietly(target)
        close_quietly(coord)
    return 0
