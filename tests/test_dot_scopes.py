"""Scopes ``.`` and ``..`` are refused everywhere: in the core, over HTTP (raw and encoded), in a store.

A proxy normalises ``/v1/locks/../acquire`` into another path, and a file
adapter must never resolve ``..``: neither is a name.
"""

from __future__ import annotations

import json
import socket

import pytest

import stockade
from stockade.core.limits import validate_scope


@pytest.mark.parametrize("scope", [".", ".."])
def test_the_core_refuses_them(scope: str) -> None:
    with pytest.raises(stockade.InvalidArgument):
        validate_scope(scope)
    for fine in ("...", ".a", "a..b", "a."):
        assert validate_scope(fine) == fine


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize("segment", ["..", ".", "%2e%2e", "%2E", ".%2e"])
def test_http_refuses_them_with_a_problem_and_grants_nothing(serve, segment: str) -> None:
    server = serve()
    body = json.dumps({"holder": "h", "ttl_ms": 5000}).encode()
    status, answer = _raw(server.port, (
        f"POST /v1/locks/{segment}/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body)
    assert 400 <= status < 500, (status, answer)
    assert b"Traceback" not in answer
    coord = stockade.connect(server.url)
    try:
        assert coord.scopes() == []
    finally:
        coord.close()


def test_a_store_refuses_them(tmp_path) -> None:
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    try:
        with coord.lock("a", ttl_ms=5000) as lease:
            for scope in (".", ".."):
                with pytest.raises(stockade.InvalidArgument):
                    store.put(scope, "k", b"v", token=lease.token)
                with pytest.raises(stockade.InvalidArgument):
                    coord.acquire(scope, ttl_ms=1000)
    finally:
        store.close()
        coord.close()
