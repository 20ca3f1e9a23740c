"""A grant answered without a task (`stockade.server._http.Deferred`): withdrawn when its client leaves before
its commit is durable, as a cancelled handler's grant is (docs/http-api.md: a grant is answered only once durable).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.work_budget import served

import stockade
from stockade.server import _http

POLLS = 100  # inspections of the scope, each after the commit in flight: the release is one commit behind


def _grant_of_a_client_that_left(data_dir: Path) -> str:
    """Acquire over a raw connection, close it while the grant's commit is in flight; the scope's state after."""
    with served(data_dir) as s:
        committed = threading.Event()
        commit_records = s.server.leases.file.commit_records
        first = threading.Event()

        def slow(changes: Any) -> Any:
            if not first.is_set():  # the grant's commit: held until the client has gone
                first.set()
                committed.wait(10)
            return commit_records(changes)

        committer = s.server.leases.committer
        s.on_loop(lambda: setattr(committer, "inline", False))  # commits in its thread: the loop serves meanwhile
        committer._run_batch = slow
        host, port = s.url.split("//")[1].split(":")
        body = json.dumps({"ttl_ms": 60_000, "holder": "left"}).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/locks/left/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert first.wait(10)  # the grant is being committed
        sock.close()
        for _ in range(POLLS):  # the loop sees the close while the commit is held
            if s.on_loop(lambda: not s.server._limits.open):
                break
            time.sleep(0.01)
        committed.set()
        coord = stockade.connect(s.url)
        try:
            for _ in range(POLLS):
                state = coord.inspect("left").state.value
                if state == "free":
                    break
                time.sleep(0.01)
            return state
        finally:
            coord.close()


def test_a_grant_whose_client_left_before_its_commit_is_withdrawn(tmp_path: Path) -> None:
    assert _grant_of_a_client_that_left(tmp_path) == "free"


def test_control_a_deferred_answer_that_ignores_the_closed_connection(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the answer built as if the client were there; the grant stays held."""
    def send_answer(self: Any, request: Any, deferred: Any, keep_alive: bool) -> None:
        response = deferred.answer(False)
        if response is not None:
            self._send(request, response, keep_alive)

    monkeypatch.setattr(_http.HttpProtocol, "_send_answer", send_answer)
    assert _grant_of_a_client_that_left(tmp_path) == "held"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
