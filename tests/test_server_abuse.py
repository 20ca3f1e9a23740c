"""`stockade serve` against a hostile peer (issue 8, finding 4): real sockets, real server processes.

Each test fails on a server that buffers bodies before the auth check, has no
timeouts, refuses new connections at its cap, buffers pipelined bodies, or
lets every bearer token touch every scope. Run with ``-s`` to see the figure
lines; ``STOCKADE_LONG=1`` runs the acceptance figure at full size
(4,200 slow or idle connections and 1,000 half-sent 1 MiB bodies).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
from conftest import HELPERS, HTTP_PARSERS, PYTHON, python_env

import stockade

sys.path.insert(0, str(HELPERS))
from server_fixtures import request  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

TOKEN = "abuse-test-token-0123456789abcdef"
SCOPED = "scoped-test-token-0123456789abcdef"
MIB = 1024 * 1024


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def address(server) -> tuple[str, int]:
    return "127.0.0.1", server.port


def recv_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (inf if it did not)."""
    sock.settimeout(0.1)
    started, data = time.monotonic(), b""
    while time.monotonic() - started < timeout:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return data, time.monotonic() - started
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, float("inf")


def tokens_file(tmp_path, *lines: str):
    path = tmp_path / "tokens"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def honest_cycle(url: str, token: str | None, scope: str = "honest") -> float:
    """One acquire+release through the client on a fresh connection; its seconds."""
    started = time.monotonic()
    coord = stockade.connect(url, auth_token=token, timeout_ms=5_000)
    try:
        lease = coord.acquire(scope, ttl_ms=5_000, keepalive=False)
        lease.release()
    finally:
        coord.close()
    return time.monotonic() - started


# -- 1. authenticate before reading a body --------------------------------------------------------


def test_unauthenticated_body_is_refused_at_its_headers_and_never_buffered(serve, tmp_path):
    server = serve("--auth-tokens", tokens_file(tmp_path, TOKEN))
    sock = socket.create_connection(address(server), timeout=5)
    sock.sendall(b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\nContent-Length: 1048576\r\n\r\n")
    answer, _ = recv_until_closed(sock, 2)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
    assert b"WWW-Authenticate: Bearer" in answer
    document = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert document == {"type": "https://stockade.invalid/problems/unauthorized", "title": "Unauthorized",
                        "status": 401}

    # 200 connections each send half of a 1 MiB body without a token: memory does not grow by it.
    before = rss_mb(server.process.pid)
    socks = []
    for _ in range(200):
        s = socket.create_connection(address(server), timeout=5)
        s.setblocking(False)
        s.send(b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\nContent-Length: 1048576\r\n\r\n")
        try:
            s.send(b"x" * (MIB // 2))
        except OSError:
            pass
        socks.append(s)
    time.sleep(0.5)
    after = rss_mb(server.process.pid)
    for s in socks:
        s.close()
    print(f"\nunauthenticated half-sent bodies: RSS before/after {before:.0f}/{after:.0f} MB over 200 x 0.5 MiB")
    assert after - before < 30, (before, after)
    # an authenticated body is still read
    status, _, body = request(server.url, "POST", "/v1/locks/a/acquire", json_body={"ttl_ms": 1000},
                              headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body


# -- 2. timeouts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("parser", HTTP_PARSERS)
def test_idle_and_slow_connections_are_closed_but_long_polls_are_not(serve, parser):
    server = serve("--idle-timeout-s", "0.5", "--header-timeout-s", "0.5", "--body-timeout-s", "1",
                   "--body-rate-min", "0", "--http-parser", parser)
    idle = socket.create_connection(address(server), timeout=5)
    slow_headers = socket.create_connection(address(server), timeout=5)
    slow_headers.sendall(b"POST /v1/locks/s/acquire HTTP/1.1\r\nHo")
    slow_body = socket.create_connection(address(server), timeout=5)
    slow_body.sendall(b"POST /v1/locks/s/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"ttl_ms\"")
    # a keep-alive connection that sends a byte now and then, never a request, is still idle
    trickle = socket.create_connection(address(server), timeout=5)
    started, trickle_closed = time.monotonic(), float("inf")
    while time.monotonic() - started < 4:
        try:
            trickle.sendall(b"\r\n")
        except OSError:
            trickle_closed = time.monotonic() - started
            break
        time.sleep(0.2)
    results = {name: recv_until_closed(sock, 5) for name, sock in
               (("idle", idle), ("slow headers", slow_headers), ("slow body", slow_body))}
    results["trickle"] = (b"", trickle_closed)
    print("\n" + "; ".join(f"{name} closed after {at:.2f} s" for name, (_, at) in results.items()))
    assert results["idle"][1] < 2.5
    assert results["trickle"][1] < 2.5
    assert results["slow headers"][1] < 2.5 and results["slow headers"][0].startswith(b"HTTP/1.1 408")
    assert results["slow body"][1] < 3.5 and results["slow body"][0].startswith(b"HTTP/1.1 408")

    # a long poll waits 2.5 s, well past every timeout, and gets its answer
    status, _, grant = request(server.url, "POST", "/v1/locks/held/acquire", json_body={"ttl_ms": 60_000})
    assert status == 200
    started = time.monotonic()
    status, _, body = request(server.url, "POST", "/v1/locks/held/acquire",
                              json_body={"ttl_ms": 1000, "wait_ms": 2500})
    assert status == 409 and b"lock-timeout" in body and time.monotonic() - started >= 2.4


def test_serve_refuses_bad_transport_numbers(tmp_path):
    for flags in (["--idle-timeout-s", "0"], ["--connections-max", "0"], ["--buffer-bytes-max", "10"],
                  ["--body-rate-min", "-1"]):
        result = subprocess.run([PYTHON, "-m", "stockade", "serve", "--data-dir", str(tmp_path / "d"), "--port",
                                 "0", *flags], capture_output=True, text=True, timeout=30, env=python_env())
        assert result.returncode != 0 and "must be" in result.stderr, (flags, result.stderr)


# -- 3. connection and memory caps ----------------------------------------------------------------


def test_connection_cap_closes_the_oldest_idle_connections_not_honest_clients(serve):
    server = serve("--connections-max", "100")
    idle = [socket.create_connection(address(server), timeout=5) for _ in range(150)]
    times = [honest_cycle(server.url, None) for _ in range(5)]
    closed = sum(recv_until_closed(sock, 0.01)[1] < 1 for sock in idle)
    for sock in idle:
        sock.close()
    print(f"\nconnection cap 100, 150 idle peers: honest cycle median {statistics.median(times) * 1000:.0f} ms "
          f"over 5; idle connections closed {closed}")
    assert max(times) < 1 and closed >= 50
    # the newest idle ones are still open: the oldest went first
    assert request(server.url, "GET", "/healthz")[0] == 200


@pytest.mark.parametrize("parser", HTTP_PARSERS)
def test_buffered_bytes_bound_answers_503_then_makes_room_from_stale_bodies(serve, parser):
    server = serve("--buffer-bytes-max", str(4 * MIB), "--http-parser", parser)
    socks, answers = [], []
    for _ in range(12):
        s = socket.create_connection(address(server), timeout=5)
        s.sendall(b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\nContent-Length: 1048576\r\n\r\n")
        s.setblocking(False)
        try:
            s.send(b"x" * (MIB // 2))
        except OSError:
            pass
        socks.append(s)
    time.sleep(0.3)
    for s in socks:
        answers.append(recv_until_closed(s, 0.2)[0])
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert refused and all(b"Retry-After: 1" in a for a in refused), [a[:40] for a in answers]
    time.sleep(1.2)  # the half-sent bodies are now stale: an honest request makes room
    times = [honest_cycle(server.url, None) for _ in range(5)]
    for s in socks:
        s.close()
    print(f"\n4 MiB buffer bound, 12 half-sent 1 MiB bodies: {len(refused)} answered 503; "
          f"honest cycle median {statistics.median(times) * 1000:.0f} ms over 5")
    assert max(times) < 1


@pytest.mark.parametrize("parser", HTTP_PARSERS)
def test_pipelined_bodies_behind_a_long_poll_are_not_read(serve, parser):
    server = serve("--http-parser", parser)
    assert request(server.url, "POST", "/v1/locks/held/acquire", json_body={"ttl_ms": 60_000})[0] == 200
    sock = socket.create_connection(address(server), timeout=10)
    wait = b'{"ttl_ms": 1000, "wait_ms": 2000}'
    head = (b"POST /v1/locks/held/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(wait), wait))
    puts = b"".join(b"PUT /v1/kv/s/k%d HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\nContent-Length: %d\r\n\r\n%s"
                    % (i, MIB, b"x" * MIB) for i in range(12))
    sock.sendall(head)
    time.sleep(0.2)
    before = rss_mb(server.process.pid)
    sender = threading.Thread(target=lambda: sock.sendall(puts), daemon=True)
    sender.start()
    time.sleep(1.2)
    during = rss_mb(server.process.pid)
    answers, _ = recv_until_closed(sock, 6)
    sender.join(5)
    sock.close()
    print(f"\n12 pipelined 1 MiB PUTs behind a long poll: RSS before/during {before:.0f}/{during:.0f} MB; "
          f"answers {answers.count(b'HTTP/1.1 ')}")
    assert during - before < 6, (before, during)
    assert answers.startswith(b"HTTP/1.1 409") and answers.count(b"HTTP/1.1 ") == 13


# -- 4. bearer tokens limited to scopes -----------------------------------------------------------


def test_scoped_tokens_touch_only_their_scopes(serve, tmp_path):
    server = serve("--auth-tokens", tokens_file(tmp_path, "# all scopes", TOKEN, f"{SCOPED} reports.* billing"))
    scoped = {"Authorization": f"Bearer {SCOPED}"}
    admin = {"Authorization": f"Bearer {TOKEN}"}
    status, _, body = request(server.url, "POST", "/v1/locks/reports.daily/acquire", json_body={"ttl_ms": 5000},
                              headers=scoped)
    assert status == 200, body
    grant = json.loads(body)
    assert request(server.url, "POST", f"/v1/leases/{grant['lease_id']}/renew", json_body={}, headers=scoped)[0] == 200
    refused = [
        ("POST", "/v1/locks/payroll/acquire", b'{"ttl_ms": 1000}'), ("POST", "/v1/locks/billing2/acquire", b"{}"),
        ("GET", "/v1/locks/payroll", None), ("GET", "/v1/locks", None), ("GET", "/v1/fence-floors", None),
        ("GET", "/metrics", None), ("GET", "/", None), ("GET", "/v1/kv/payroll/k", None),
        ("PUT", "/v1/kv/payroll/k", b"v"), ("GET", "/v1/hwm/%72eports2", None), ("GET", "/v1/kv/billingx", None),
    ]
    for method, path, data in refused:
        status, _, body = request(server.url, method, path, body=data, headers={
            **scoped, "Content-Type": "application/json" if method == "POST" else "application/octet-stream",
            "Fencing-Token": grant["token"]})
        assert status == 403, (method, path, status, body)
        assert json.loads(body)["type"].endswith("/unauthorized")
    for path in ("/v1/locks/billing", "/v1/hwm/%72eports.x", "/v1/cluster", "/openapi.json"):
        assert request(server.url, "GET", path, headers=scoped)[0] == 200, path
    assert request(server.url, "DELETE", f"/v1/leases/{grant['lease_id']}", headers=scoped)[0] == 204
    assert request(server.url, "GET", "/v1/locks", headers=admin)[0] == 200
    # the client raises Unauthorized for a scope outside the token's
    coord = stockade.connect(server.url, auth_token=SCOPED)
    try:
        coord.acquire("reports.x", ttl_ms=1000, keepalive=False).release()
        with pytest.raises(stockade.Unauthorized):
            coord.acquire("payroll", ttl_ms=1000, keepalive=False)
    finally:
        coord.close()


def test_token_file_refuses_bad_scope_patterns(tmp_path):
    for line in (f"{SCOPED} bad/scope", f"{SCOPED} re*ports", f"{SCOPED} **"):
        path = tokens_file(tmp_path, line)
        result = subprocess.run([PYTHON, "-m", "stockade", "serve", "--data-dir", str(tmp_path / "d"), "--port",
                                 "0", "--auth-tokens", path], capture_output=True, text=True, timeout=30,
                                env=python_env())
        assert result.returncode != 0 and "scope" in result.stderr, (line, result.stderr)


# -- acceptance: honest clients under a flood ------------------------------------------------------

LONG = os.environ.get("STOCKADE_LONG") == "1"


def _flood(serve, tmp_path, *, idle: int, slow: int, bodies: int, honest: int, seconds: float, auth: bool = True):
    """Without auth, the attacker's bodies are read: the buffered-bytes bound is what holds."""
    server = serve("--auth-tokens", tokens_file(tmp_path, TOKEN)) if auth else serve()
    token = TOKEN if auth else None
    pid = server.process.pid
    before = rss_mb(pid)
    attack = subprocess.Popen([PYTHON, str(HELPERS / "abuse.py"), "127.0.0.1", str(server.port), "--idle", str(idle),
                               "--slow", str(slow), "--bodies", str(bodies), "--seconds", str(seconds)],
                              stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        assert attack.stdout is not None and attack.stdout.readline().strip() == "started"
        time.sleep(min(5.0, seconds / 4))  # let the connections pile up
        peak = rss_mb(pid)
        times = []
        for _ in range(honest):
            times.append(honest_cycle(server.url, token))
            peak = max(peak, rss_mb(pid))
            time.sleep(0.1)
        peak = max(peak, rss_mb(pid))
        attack.terminate()  # measured: the rest of its `seconds` would be waited out for nothing
        out, _ = attack.communicate(timeout=seconds + 60)
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    peak = max(peak, rss_mb(pid))
    median_ms = statistics.median(times) * 1000
    print(f"\nflood (auth {'on' if auth else 'off'}) {idle} idle + {slow} slow + {bodies} half-sent 1 MiB bodies: "
          "honest acquire+release "
          f"median {median_ms:.0f} ms over {len(times)} (max {max(times) * 1000:.0f} ms); "
          f"server RSS before/peak {before:.0f}/{peak:.0f} MB; attacker {out.strip().splitlines()[-1]}")
    return median_ms, before, peak


def test_honest_clients_are_served_under_a_small_flood(serve, tmp_path):
    median_ms, before, peak = _flood(serve, tmp_path, idle=300, slow=300, bodies=100, honest=20, seconds=12)
    assert median_ms < 1000
    assert peak < before + 30


@pytest.mark.skipif(not LONG, reason="STOCKADE_LONG=1 runs the full-size flood")
@pytest.mark.parametrize("auth", [True, False], ids=["auth", "open"])
def test_honest_clients_are_served_under_the_full_flood(serve, tmp_path, auth):
    median_ms, before, peak = _flood(serve, tmp_path, idle=2100, slow=2100, bodies=1000, honest=30, seconds=40,
                                     auth=auth)
    assert median_ms < 1000
    assert peak < 256  # MB: the bound stated in docs/http-api.md


def test_a_peer_that_never_reads_its_answers_is_cut_off(serve):
    server = serve("--idle-timeout-s", "1")
    sock = socket.create_connection(address(server), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    asked = 300
    try:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * asked)
    except OSError:
        pass
    time.sleep(3)  # the server's send buffer is full: it stops taking requests, then cuts the peer off
    data, closed_at = recv_until_closed(sock, 5)
    sock.close()
    answered = data.count(b"HTTP/1.1 200")
    print(f"\npeer that never reads: {answered} of {asked} answers delivered, then cut off")
    assert closed_at < 5 and answered < asked
    assert request(server.url, "GET", "/healthz")[0] == 200
