"""The HTTP client reuses a response head it has parsed before (``_HEADS``), and only where that is the same answer.

A head's meaning depends on its bytes and on the request's method (a ``HEAD`` answer has no body), nothing
else; each response still gets headers of its own. The control, a cache keyed by the bytes alone, reads
the body of a ``GET`` after a ``HEAD`` had the same head, and must fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from stockade.transport._sync import http_client
from stockade.transport._sync.http_client import HTTPConnection
from stockade.transport.http11 import parse_head


class _Stream:
    """Answers each request with the next canned bytes."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers

    def send(self, data: bytes, timeout_s: float) -> None:
        pass

    def receive(self, bytes_max: int, timeout_s: float) -> bytes:
        return self.answers.pop(0) if self.answers else b""

    def is_stale(self) -> bool:
        return False

    def close(self) -> None:
        pass


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2"


def _roundtrips(methods: list[str]) -> list[Any]:
    answers = [HEAD + b"\r\n\r\n" + (b"" if method == "HEAD" else b"{}") for method in methods]
    connection = HTTPConnection(_Stream(answers))
    return [connection.roundtrip(method, b"x", 1e18) for method in methods]


@pytest.fixture(autouse=True)
def _empty() -> Any:
    http_client._HEADS.clear()
    yield
    http_client._HEADS.clear()


def test_a_head_seen_again_is_the_same_answer_with_headers_of_its_own() -> None:
    first, second = _roundtrips(["GET", "GET"])
    assert (first.status, first.headers, first.body) == (second.status, second.headers, second.body) == (
        200, {"content-type": "application/json", "content-length": "2"}, b"{}")
    assert first.headers is not second.headers
    assert len(http_client._HEADS) == 1


def test_the_method_is_part_of_the_key() -> None:
    head, get = _roundtrips(["HEAD", "GET"])
    assert (head.body, get.body) == (b"", b"{}")


def test_control_a_key_without_the_method_reads_a_get_as_a_head(monkeypatch: pytest.MonkeyPatch) -> None:
    class ByBytes(dict):  # type: ignore[type-arg]
        def get(self, key: Any, default: Any = None) -> Any:
            return super().get(key[0], default)

        def __setitem__(self, key: Any, value: Any) -> None:
            super().__setitem__(key[0], value)

    monkeypatch.setattr(http_client, "_HEADS", ByBytes())
    head, get = _roundtrips(["HEAD", "GET"])
    assert get.body != b"{}"  # the GET was framed as the HEAD: its body left unread


def test_the_kept_heads_are_bounded() -> None:
    for n in range(http_client.HEADS_KEPT_MAX * 3):
        http_client._parsed(b"HTTP/1.1 200 OK\r\nX-N: %d\r\nContent-Length: 0" % n, "GET")
        assert len(http_client._HEADS) <= http_client.HEADS_KEPT_MAX
    big = b"HTTP/1.1 200 OK\r\nX: " + b"y" * http_client.HEAD_KEPT_BYTES_MAX + b"\r\nContent-Length: 0"
    http_client._HEADS.clear()
    assert http_client._parsed(big, "GET") == parse_head(big, method="GET") and not http_client._HEADS
