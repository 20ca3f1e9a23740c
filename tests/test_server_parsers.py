"""The server's two request parsers answer alike, and a server on either keeps its state against bad bytes.

`stockade.server._h1` (pure Python, the base install's parser) and httptools
(the ``server`` extra's) are each put under the real connection protocol
(`stockade.server._http.HttpProtocol`) with a transport that records what it is
given, and fed the same bytes: a corpus of hand-written requests, and mutations
of valid ones (bytes cut, doubled, replaced, CRLFs dropped), each whole and cut
at random points. What a client would see must be the same bytes and the same
close. The control, a parser that takes a bare LF as a line end (as lenient
parsers do), must be caught by the same comparison.

Then, on real `stockade serve` processes, one per parser: truncated, oversized,
badly chunked and header-injected requests each get a 4xx or a closed
connection, never a 5xx, and change nothing (every lock, high-water mark and value).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import HELPERS, HTTP_PARSERS

from stockade.server._guard import ConnectionLimits
from stockade.server._h1 import HEADERS_MAX, URL_BYTES_MAX, RequestParser, make_parser
from stockade.server._http import HttpProtocol, Request, Response, json_response

sys.path.insert(0, str(HELPERS))
from server_fixtures import request, start_server  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

try:
    HTTPTOOLS: Any = make_parser("httptools")
except ImportError:
    HTTPTOOLS = None
needs_httptools = pytest.mark.skipif(HTTPTOOLS is None, reason="httptools (the server extra) is not installed")


class _Transport:
    """What a protocol writes and whether it closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.written += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _echo(request: Request) -> Response:
    """The request as the application would see it."""
    return json_response(200, [request.method, request.raw_path, request.query, sorted(request.headers.items()),
                               sorted(request.repeated), request.body.hex()])


def _seen(parser: Any, pieces: list[bytes]) -> tuple[bytes, bool]:
    """What a client is sent, and whether its connection closes, for ``pieces`` sent one after another
    (called inside a running event loop: the handler answers at once, nothing is awaited)."""
    transport = _Transport()
    limits = ConnectionLimits()
    protocol = HttpProtocol(_echo, lambda request, response, now: None, lambda path: 4096, limits, parser)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    for piece in pieces:
        if transport.closed:
            break
        protocol.data_received(piece)
    limits.stop()
    return bytes(transport.written), transport.closed


def _in_loop(function: Any, *args: Any) -> Any:
    async def run() -> Any:
        return function(*args)
    return asyncio.run(run())


def _cuts(data: bytes, rng: random.Random) -> list[list[bytes]]:
    """``data`` whole, byte by byte (when short), and cut at three random points."""
    ways = [[data]]
    if len(data) <= 400:
        ways.append([data[i:i + 1] for i in range(len(data))])
    points = sorted(rng.randrange(len(data) + 1) for _ in range(3))
    ways.append([data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)])
    return ways


GET = b"GET /v1/locks?limit=2 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
POST = (b'POST /v1/locks/s/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n'
        b'{"ttl_ms": 10}')
CHUNKED = (b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"3;ext=1\r\nabc\r\n0002\r\nde\r\n0\r\nTrailer-Field: t\r\n\r\n")


def corpus() -> list[bytes]:
    """Requests a server meets: valid, pipelined, and each way of getting one wrong."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\n"
    cases = [
        GET, POST, CHUNKED, GET + POST + CHUNKED + GET, b"\r\n\r\n" + GET, GET.replace(b"1.1", b"1.0"),
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + GET, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n" + GET,
        b"GET / HTTP/1.1\r\nConnection: Keep-Alive, CLOSE\r\n\r\n", b"GET http://h:1/a/b?c=d#f HTTP/1.1\r\n\r\n",
        b"GET /a#frag HTTP/1.1\r\n\r\n", b"GET /%7e?\xe9 HTTP/1.1\r\n\r\n", b"OPTIONS * HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX:\r\nY: \t a  b \t\r\nZ: \xff\r\n\r\n",
        # request line
        b"get / HTTP/1.1\r\n\r\n", b"FOO / HTTP/1.1\r\n\r\n", b"GET  / HTTP/1.1\r\n\r\n", b"GET /  HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1 \r\n\r\n", b"GET / HTTP/2.0\r\n\r\n", b"GET / HTTP/0.9\r\n\r\n", b"GET / http/1.1\r\n\r\n",
        b"GET /\x01 HTTP/1.1\r\n\r\n", b"GET /a\tb HTTP/1.1\r\n\r\n", b"GET\r\n\r\n", b"GET /\r\n\r\n",
        b" GET / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\n\n", b"GET / HTTP/1.1\r\nHost: x\n\r\n",
        b"GET / HTTP/1.1\rHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"GET x HTTP/1.1\r\n\r\n",
        b"GET " + b"/" * (URL_BYTES_MAX + 1) + b" HTTP/1.1\r\n\r\n",
        b"GET " + b"/" * URL_BYTES_MAX + b" HTTP/1.1\r\n\r\n",
        b"CONNECT h:443 HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        # header lines
        head + b"Bad Name: x\r\n\r\n", head + b"Name : x\r\n\r\n", head + b": x\r\n\r\n", head + b"NoColon\r\n\r\n",
        head + b"X: a\r\n folded\r\n\r\n", head + b"X: a\x00b\r\n\r\n", head + b"X: a\x7fb\r\n\r\n",
        head + b"X: a\rContent-Length: 5\r\n\r\nhello", head + b"X: a\nContent-Length: 5\r\n\r\nhello",
        head + b"\xe9: x\r\n\r\n", head + b"X-\x01: x\r\n\r\n",
        head + b"".join(b"H%d: v\r\n" % i for i in range(HEADERS_MAX)) + b"\r\n",
        head + b"".join(b"H%d: v\r\n" % i for i in range(HEADERS_MAX + 1)) + b"\r\n",
        head + b"Big: " + b"v" * 16_500 + b"\r\n\r\n", head + b"X: 1\r\nX: 2\r\n\r\n",
        # framing
        head + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", head + b"Content-Length: 3, 3\r\n\r\nabc",
        head + b"Content-Length: +3\r\n\r\nabc",
        head + b"Content-Length: -1\r\n\r\n", head + b"Content-Length: \r\n\r\n",
        head + b"Content-Length: 0x3\r\n\r\nabc", head + b"Content-Length: 99999999999999999999999\r\n\r\n",
        head + b"Content-Length: 5000\r\n\r\n", head + b"Content-Length:  2 \r\n\r\nab",
        head + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: gzip\r\n\r\n", head + b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\nz\r\n", head + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 17 + b"\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n1000\r\n",
        head + b"Transfer-Encoding: chunked\r\n\r\n0\r\nBad Trailer: x\r\n\r\n",
        # chunk extensions as llhttp takes them (empty names and values) and refuses them (spaces, a last ";")
        *(head + b"Transfer-Encoding: chunked\r\n\r\n" + ext + b"\r\nabc\r\n0\r\n\r\n" for ext in (
            b"3;=", b"3;;a", b"3;a;", b"3;a=1;", b'3;a="x y"', b'3;a="x\\"y"', b'3;a="x"y', b"3; a=1", b"3;a= 1",
            b"3;a=b=c")),
        # truncated
        GET[:20], POST[:-3], CHUNKED[:-7], b"\r\n",
    ]
    return cases


def _mutations(rng: random.Random, count: int) -> list[bytes]:
    """Valid requests with a few bytes cut, doubled, replaced, or their CRLFs made bare."""
    out = []
    alphabet = b" \t\r\n:;,0123456789abcdefABCDEF/?#%\x00\x7f\xff-chunkedContent-LengthTransfer-Encoding"
    for _ in range(count):
        data = bytearray(rng.choice([GET, POST, CHUNKED, GET + POST, CHUNKED + GET]))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            kind = rng.randrange(4)
            if kind == 0:
                del data[at:at + rng.randint(1, 4)]
            elif kind == 1:
                data[at:at] = data[at:at + rng.randint(1, 6)]
            elif kind == 2:
                data[at] = rng.choice(alphabet)
            else:
                crlf = data.find(b"\r\n", at)
                if crlf >= 0:
                    del data[crlf]
        out.append(bytes(data))
    return out


def _differences(left: Any, right: Any, cases: list[bytes], seed: int) -> list[tuple[bytes, Any, Any]]:
    return _in_loop(_compare, left, right, cases, seed)


def _compare(left: Any, right: Any, cases: list[bytes], seed: int) -> list[tuple[bytes, Any, Any]]:
    rng = random.Random(seed)
    found = []
    for data in cases:
        for pieces in _cuts(data, rng):
            a, b = _seen(left, pieces), _seen(right, pieces)
            if a != b:
                found.append((data, a, b))
                break
    return found


@needs_httptools
def test_both_parsers_answer_the_corpus_alike() -> None:
    cases = corpus()
    found = _differences(RequestParser, HTTPTOOLS, cases, seed=1)
    print(f"\nparsers on the corpus: {len(found)} of {len(cases)} requests answered differently")
    assert found == [], found[:3]


@needs_httptools
def test_both_parsers_answer_mutated_requests_alike() -> None:
    cases = _mutations(random.Random(27), 1500)
    found = _differences(RequestParser, HTTPTOOLS, cases, seed=2)
    print(f"\nparsers on mutations: {len(found)} of {len(cases)} requests answered differently")
    assert found == [], found[:3]


class _BareLF(RequestParser):
    """The control: a lenient parser that reads a bare LF as a line end."""

    def feed_data(self, data: bytes) -> None:
        super().feed_data(data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))


@needs_httptools
def test_control_a_lenient_parser_is_told_apart() -> None:
    found = _differences(_BareLF, HTTPTOOLS, corpus(), seed=1)
    assert len(found) >= 3, found


def test_the_python_parser_frames_pipelined_requests_however_cut() -> None:
    """Without httptools too: three requests cut anywhere give three echoes, in order, on one connection."""
    data = GET + POST + CHUNKED
    whole = _in_loop(_seen, RequestParser, [data])
    assert whole[0].count(b"HTTP/1.1 200 OK") == 3 and not whole[1]
    rng = random.Random(5)
    for pieces in [[data[i:i + 1] for i in range(len(data))]] + [_cuts(data, rng)[-1] for _ in range(50)]:
        assert _in_loop(_seen, RequestParser, pieces) == whole
    body = json.loads(whole[0].rsplit(b"\r\n\r\n", 1)[1])
    assert body[0] == "PUT" and bytes.fromhex(body[5]) == b"abcde" and ["trailer-field", "t"] in body[3]


# -- real servers: bad bytes get a 4xx or a closed connection, and change nothing ------------------


@pytest.fixture(scope="module", params=HTTP_PARSERS)
def parsed_server(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    # short timeouts: a truncated request is answered 408 within a second, an idle connection closed
    proc = start_server(tmp_path_factory.mktemp(f"parser-{request.param}") / "data", "--http-parser", request.param,
                        "--header-timeout-s", "0.5", "--body-timeout-s", "0.5", "--idle-timeout-s", "0.5")
    yield proc
    assert proc.stop() == 0, proc.logs()[-2000:]
    assert "Traceback" not in proc.logs()


def _call(url: str, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    status, _, body = request(url, method, path, **kw)
    return status, json.loads(body) if body[:1] in (b"{", b"[") else body


def _state(url: str) -> Any:
    locks = _call(url, "GET", "/v1/locks")[1]["locks"]
    for lock in locks:
        lock.pop("remaining_ms")
    return locks, _call(url, "GET", "/v1/hwm/s")[1], _call(url, "GET", "/v1/kv/s")[1]


def _answer(url: str, data: bytes) -> tuple[int | None, bool]:
    """Send ``data``; the status of the first answer (None: none) and whether the server closed (it closes
    after a refusal, a timeout, or idle)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        received = b""
        deadline = time.monotonic() + 15
        closed = False
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    status = int(received[9:12]) if received.startswith(b"HTTP/1.1 ") else None
    return status, closed


def _hostile(token: str, lease: str) -> list[bytes]:
    put = (b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: " + token.encode() +
           b"\r\nContent-Type: application/octet-stream\r\n")
    release = b"DELETE /v1/leases/" + lease.encode() + b" HTTP/1.1\r\nHost: x\r\n"
    return [
        put + b"Content-Length: 10\r\n\r\nchanged",  # truncated body
        put[:30], release[:-2],  # truncated heads
        put + b"Content-Length: 2000000\r\n\r\n" + b"x" * 4096,  # oversized body
        b"GET /" + b"a" * (URL_BYTES_MAX + 10) + b" HTTP/1.1\r\n\r\n",  # oversized target
        put + b"".join(b"H%d: v\r\n" % i for i in range(HEADERS_MAX + 1)) + b"Content-Length: 1\r\n\r\nc",
        put + b"Transfer-Encoding: chunked\r\n\r\n7\r\nchanged\r\nzz\r\n\r\n",  # bad chunk size
        put + b"Transfer-Encoding: chunked\r\n\r\n7\r\nchangedXX0\r\n\r\n",  # no CRLF after the chunk
        put + b"Transfer-Encoding: chunked\r\n\r\n7\r\nchanged\r\n",  # no last chunk
        put + b"Transfer-Encoding: chunked\r\nContent-Length: 7\r\n\r\n7\r\nchanged\r\n0\r\n\r\n",  # smuggling
        put + b"Content-Length: 7\r\nContent-Length: 9\r\n\r\nchanged",
        put + b"Transfer-Encoding: gzip\r\n\r\nchanged",
        put[:-2] + b"\rIdempotency-Key: x\r\nContent-Length: 7\r\n\r\nchanged",  # a bare CR: header injection
        put[:-2] + b"\nContent-Length: 7\r\n\r\nchanged",  # a bare LF
        put + b"X: a\r\n Content-Length: 7\r\n\r\nchanged",  # line folding
        put.replace(b"Fencing-Token", b"Fencing Token") + b"Content-Length: 7\r\n\r\nchanged",
        release.replace(b"DELETE", b"DELET") + b"\r\n", release.replace(b"HTTP/1.1", b"HTTP/9.9") + b"\r\n",
        release + b"Connection: upgrade\r\nUpgrade: h2c\r\n\r\n",
        release + b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n",  # which counts? (a proxy's)
        release + b"Cookie: a=1\r\ncookie: b=2\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(256)),  # a TLS hello
    ]


def test_bad_bytes_get_a_4xx_or_a_close_and_change_nothing(parsed_server) -> None:  # type: ignore[no-untyped-def]
    url = parsed_server.url
    status, grant = _call(url, "POST", "/v1/locks/s/acquire", json_body={"ttl_ms": 600_000})
    assert status == 200
    status, _ = _call(url, "PUT", "/v1/kv/s/k", body=b"original",
                      headers={"Fencing-Token": grant["token"], "Content-Type": "application/octet-stream"})
    assert status == 200
    before = _state(url)
    cases = _hostile(grant["token"], grant["lease_id"])
    with ThreadPoolExecutor(len(cases)) as pool:  # each waits for its answer or close (about a second)
        outcomes = list(pool.map(lambda data: _answer(url, data), cases))
    wrong = [(data[:60], outcome) for data, outcome in zip(cases, outcomes, strict=True)
             if not (outcome[0] is None and outcome[1] or outcome[0] is not None and 400 <= outcome[0] < 500)]
    print(f"\n{parsed_server.data_dir.parent.name}: {len(cases) - len(wrong)} of {len(cases)} hostile requests "
          f"got a 4xx or a close; statuses {sorted({o[0] for o in outcomes}, key=str)}")
    assert wrong == []
    assert _state(url) == before
    # the control: the same connection with a well-formed release does change the state
    assert _answer(url, b"DELETE /v1/leases/" + grant["lease_id"].encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 204
    assert _state(url) != before


def test_serve_runs_without_httptools_and_uvloop(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The base install: with neither package importable, the server parses with _h1 on asyncio's loop and
    answers a lock cycle; asking for httptools there stops it at startup in one line."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in ("httptools", "uvloop"):
        (hidden / f"{name}.py").write_text(f"raise ImportError('{name} is hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")]))
    check = subprocess.run([sys.executable, "-c", "import stockade.server._http as h; print(h._DEFAULT_PARSER)"],
                           capture_output=True, text=True, timeout=60)
    assert "stockade.server._h1.RequestParser" in check.stdout, check.stdout + check.stderr
    server = start_server(tmp_path / "data")
    try:
        status, grant = _call(server.url, "POST", "/v1/locks/s/acquire", json_body={"ttl_ms": 10_000})
        assert status == 200
        assert _call(server.url, "DELETE", f"/v1/leases/{grant['lease_id']}")[0] == 204
    finally:
        assert server.stop() == 0
    refused = subprocess.run([sys.executable, "-m", "stockade", "serve", "--data-dir", str(tmp_path / "d2"), "--port",
                              "0", "--http-parser", "httptools"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "httptools is not installed" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
