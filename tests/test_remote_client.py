"""The remote client's own behaviour, against scripted fake servers: a server that is
down, one that never answers, connection reuse, idle connections the server closed,
and the translation of problem documents into stockade's exceptions.

The coordinator conformance suite (stockade.testing.conformance.coordinator) runs the same API against a real
`stockade serve`; this file covers what only a misbehaving server can show.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

import stockade
from stockade import BackendUnavailable, InvalidArgument, LockTimeout, NotHolder, StaleToken
from stockade.client._shared import http_endpoint
from stockade.core.tokens import FencingToken
from stockade.testing.servers.ports import free_port
from stockade.transport.http11 import RemoteProblem, parse_head

CLUSTER = "0123456789abcdef"
PROBLEM = "https://stockade.invalid/problems/"


def json_response(status: int, doc: object, *, content_type: str = "application/json", extra: str = "") -> bytes:
    body = json.dumps(doc).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def problem(status: int, code: str, **fields: object) -> bytes:
    doc = {"type": PROBLEM + code, "title": code, "status": status, "detail": f"{code} detail", **fields}
    return json_response(status, doc, content_type="application/problem+json")


class FakeServer:
    """A threaded HTTP/1.1 server whose answers are scripted per request.

    ``answer(method, path, headers, body) -> bytes | None``: raw response bytes, or
    None to say nothing (the client must time out). Records every request with the
    number of the connection it came on.
    """

    def __init__(self, answer: Callable[[str, str, dict[str, str], bytes], bytes | None], *, close_after: bool = False):
        self.answer = answer
        self.close_after = close_after
        self.requests: list[tuple[int, str, str, dict[str, str]]] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, self.connections), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                size = int(headers.get("content-length", "0"))
                while len(buffer) < size:
                    buffer += sock.recv(65536)
                body, buffer = buffer[:size], buffer[size:]
                self.requests.append((number, method, path, headers))
                response = self.answer(method, path, headers, body)
                if response is None:
                    time.sleep(30)
                    return
                sock.sendall(response)
                if self.close_after:
                    sock.close()
                    return
        except OSError:
            return

    def close(self) -> None:
        self._stop = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass


def cluster_then(answer: Callable[[str, str, dict[str, str], bytes], bytes | None]):
    """Answer ``GET /v1/cluster`` (the handle's opening call), the rest by ``answer``."""

    def respond(method: str, path: str, headers: dict[str, str], body: bytes) -> bytes | None:
        if path == "/v1/cluster":
            return json_response(200, {"cluster_id": CLUSTER})
        return answer(method, path, headers, body)

    return respond


def scope_doc(scope: str = "s") -> dict[str, object]:
    return {"scope": scope, "state": "free", "holder": None, "token": None, "token_value": None,
            "last_token": 3, "remaining_ms": 0, "waiters": 0}


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def start(answer, **kw) -> FakeServer:
        server = FakeServer(answer, **kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


# -- a server that is down -----------------------------------------------------------------


@pytest.mark.parametrize("opener", [stockade.connect, stockade.connect_async, stockade.open_store])
def test_server_down_is_backend_unavailable_at_once(opener):
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        opener(f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - t0 < 2.5  # refused at once, not after the 3 s connect timeout (a busy host: slack)
    assert info.value.certain_no_effect is True
    assert "cannot connect" in str(info.value) and isinstance(info.value.__cause__, OSError)


def test_server_gone_after_connect(fake):
    server = fake(cluster_then(lambda *a: json_response(200, scope_doc())))
    coord = stockade.connect(server.url)
    assert coord.inspect("s").last_token == 3
    server.close()
    time.sleep(0.05)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable):
        coord.inspect("s")
    assert time.monotonic() - t0 < 2.5  # at once, not after a timeout
    coord.close()


# -- a server that is slow -----------------------------------------------------------------


def test_slow_server_times_out_sync(fake):
    server = fake(cluster_then(lambda *a: None))
    coord = stockade.connect(server.url, timeout_ms=300)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        coord.inspect("s")
    elapsed = time.monotonic() - t0
    assert 0.29 <= elapsed < 5, elapsed  # its 300 ms, not the default 10 s (the slack is for a busy host)
    assert "within 300 ms" in str(info.value) and info.value.certain_no_effect is False
    coord.close()


def test_slow_server_times_out_async(fake):
    server = fake(cluster_then(lambda *a: None))

    async def body():
        coord = stockade.connect_async(server.url, timeout_ms=300)
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await coord.inspect("s")
        assert 0.29 <= time.monotonic() - t0 < 5
        await coord.aclose()

    asyncio.run(body())


def test_acquire_deadline_is_timeout_plus_wait(fake):
    # The server long-polls an acquire: the client allows wait_ms on top of timeout_ms.
    server = fake(cluster_then(lambda *a: None))
    coord = stockade.connect(server.url, timeout_ms=200)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable):
        coord.acquire("s", ttl_ms=1000, wait_ms=300)
    assert 0.49 <= time.monotonic() - t0 < 5
    coord.close()


def test_server_that_never_answers_the_opening_call(fake):
    server = fake(lambda *a: None)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable):
        stockade.connect(server.url, timeout_ms=200)
    assert time.monotonic() - t0 < 5


# -- keep-alive and connection reuse -------------------------------------------------------


def test_connections_are_reused_sync(fake):
    server = fake(cluster_then(lambda *a: json_response(200, scope_doc())))
    coord = stockade.connect(server.url)
    opened = server.connections
    for _ in range(50):
        coord.inspect("s")
    assert server.connections == opened + 1  # one connection for 50 requests
    assert len({number for number, *_ in server.requests[-50:]}) == 1
    coord.close()


def test_connections_are_reused_async(fake):
    server = fake(cluster_then(lambda *a: json_response(200, scope_doc())))

    async def body():
        coord = stockade.connect_async(server.url)
        opened = server.connections
        for _ in range(50):
            await coord.inspect("s")
        assert server.connections == opened + 1
        # concurrent requests each take a connection, and they are kept for later
        await asyncio.gather(*[coord.inspect("s") for _ in range(4)])
        before = server.connections
        await asyncio.gather(*[coord.inspect("s") for _ in range(4)])
        assert server.connections == before
        await coord.aclose()

    asyncio.run(body())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_idle_connection_closed_by_server_is_replaced(fake, mode):
    # The server drops each connection after answering (as an idle timeout would),
    # without a "Connection: close": every request must still succeed.
    server = fake(cluster_then(lambda *a: json_response(200, scope_doc())), close_after=True)

    async def body():
        coord = stockade.connect_async(server.url)
        for _ in range(5):
            assert (await coord.inspect("s")).last_token == 3
            await asyncio.sleep(0.01)
        await coord.aclose()

    if mode == "async":
        asyncio.run(body())
    else:
        coord = stockade.connect(server.url)
        for _ in range(5):
            assert coord.inspect("s").last_token == 3
            time.sleep(0.01)
        coord.close()
    assert server.connections >= 6


def test_connection_close_header_is_honoured(fake):
    server = fake(cluster_then(lambda *a: json_response(200, scope_doc(), extra="Connection: close\r\n")))
    coord = stockade.connect(server.url)
    opened = server.connections
    for _ in range(3):
        coord.inspect("s")
    assert server.connections == opened + 3
    coord.close()


def test_cancelled_request_does_not_poison_the_pool(fake):
    slow = {"on": True}

    def answer(method, path, headers, body):
        if slow["on"]:
            return None
        return json_response(200, scope_doc())

    server = fake(cluster_then(answer))

    async def body():
        coord = stockade.connect_async(server.url)
        task = asyncio.ensure_future(coord.inspect("s"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        slow["on"] = False
        assert (await coord.inspect("s")).last_token == 3  # a fresh connection, not the half-read one
        await coord.aclose()

    asyncio.run(body())


# -- headers the client sends --------------------------------------------------------------


def test_bearer_token_and_fencing_token_are_sent(fake):
    token = FencingToken(CLUSTER, "s", 7)

    def answer(method, path, headers, body):
        return json_response(200, {"scope": "s", "key": "a/b c", "token_value": 7, "high_water": 7,
                                   "commit_seq": 1, "replayed": False})

    server = fake(cluster_then(answer))
    store = stockade.open_store(server.url, auth_token="sekrit-1", cluster_id=CLUSTER)
    result = store.put("s", "a/b c", b"v", token=token, idempotency_key="idem-1")
    assert result.high_water == 7
    _, method, path, headers = server.requests[-1]
    assert (method, path) == ("PUT", "/v1/kv/s/a%2Fb%20c")
    assert headers["authorization"] == "Bearer sekrit-1"
    assert headers["fencing-token"] == token.encode() and headers["idempotency-key"] == "idem-1"
    assert headers["content-type"] == "application/octet-stream"
    assert all(h.get("authorization") == "Bearer sekrit-1" for _, _, _, h in server.requests)
    store.close()


def test_store_refuses_a_server_of_another_cluster(fake):
    server = fake(cluster_then(lambda *a: None))
    with pytest.raises(InvalidArgument):
        stockade.open_store(server.url, cluster_id="fedcba9876543210")


# -- problems become the same exceptions as embedded ------------------------------------------


def test_problem_documents_become_typed_errors(fake):
    token = FencingToken(CLUSTER, "s", 2)
    answers = {
        ("POST", "/v1/locks/s/acquire"): problem(409, "lock-timeout"),
        ("POST", "/v1/leases/abcdefabcdefabcdef/renew"): problem(410, "not-holder"),
        ("PUT", "/v1/kv/s/k"): problem(409, "stale-token", token=token.encode(), high_water=5),
        ("DELETE", "/v1/kv/s/k"): problem(409, "token-mismatch", reason="wrong-scope"),
        ("GET", "/v1/locks/s"): problem(503, "backend-unavailable"),
        ("GET", "/v1/hwm/s"): problem(401, "unauthorized"),
    }
    server = fake(cluster_then(lambda method, path, *a: answers[(method, path)]))
    coord = stockade.connect(server.url)
    store = stockade.open_store(server.url)
    with pytest.raises(LockTimeout) as info:
        coord.acquire("s", ttl_ms=1000, wait_ms=10)
    assert info.value.scope == "s" and info.value.wait_ms == 10
    assert isinstance(info.value.__cause__, RemoteProblem) and info.value.__cause__.status == 409
    with pytest.raises(NotHolder):
        coord._port.renew("abcdefabcdefabcdef")
    with pytest.raises(StaleToken) as stale:
        store.put("s", "k", b"v", token=token)
    assert stale.value.token == token and stale.value.high_water == 5
    with pytest.raises(stockade.TokenMismatch) as mismatch:
        store.delete("s", "k", token=token)
    assert mismatch.value.reason == "wrong-scope"
    with pytest.raises(BackendUnavailable):
        coord.inspect("s")
    with pytest.raises(stockade.Unauthorized):
        store.high_water("s")
    coord.close()
    store.close()


def test_not_http_is_backend_unavailable(fake):
    server = fake(cluster_then(lambda *a: b"SSH-2.0-OpenSSH\r\n\r\n"))
    coord = stockade.connect(server.url)
    with pytest.raises(BackendUnavailable):
        coord.inspect("s")
    coord.close()


def test_bad_arguments_fail_before_any_request(fake):
    server = fake(cluster_then(lambda *a: pytest.fail("no request expected")))
    store = stockade.open_store(server.url)
    token = FencingToken(CLUSTER, "s", 1)
    count = len(server.requests)
    for call in (lambda: store.put("bad scope", "k", b"", token=token), lambda: store.put("s", "", b"", token=token),
                 lambda: store.put("s", "k", b"x" * (1024 * 1024 + 1), token=token),
                 lambda: store.put("s", "k", b"", token=token, idempotency_key="has space")):
        with pytest.raises(InvalidArgument):
            call()
    assert len(server.requests) == count
    store.close()


# -- the wire, without a socket ----------------------------------------------------------------


def test_chunked_response_is_read(fake):
    body = json.dumps(scope_doc()).encode()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])
    ) + b"0\r\n\r\n"
    server = fake(cluster_then(lambda *a: chunked))
    coord = stockade.connect(server.url)
    assert coord.inspect("s").last_token == 3
    assert coord.inspect("s").last_token == 3  # and the connection stayed usable
    coord.close()


def test_parse_head_framing():
    assert parse_head(b"HTTP/1.1 204 No Content\r\nX: y", method="DELETE").body_length == 0
    assert parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5", method="GET").keep_alive is True
    until_close = parse_head(b"HTTP/1.0 200 OK", method="GET")
    assert until_close.body_length == -2 and until_close.keep_alive is False


@pytest.mark.parametrize(
    "url, kw",
    [("http://", {}), ("http://u:p@h:1", {}), ("http://h:1?x=1", {}), ("http://h:99999", {}),
     ("http://h:1", {"timeout_ms": 0}), ("http://h:1", {"auth_token": "has space"}),
     ("http://h:1", {"tls_ca": "/nonexistent"}), ("https://h:1", {"tls_ca": "/nonexistent"})],
)
def test_bad_remote_options(url, kw):
    with pytest.raises(InvalidArgument):
        http_endpoint(url, **kw)


def test_endpoint_repr_hides_the_bearer_token():
    assert "sekrit" not in repr(http_endpoint("http://h:1", auth_token="sekrit"))
