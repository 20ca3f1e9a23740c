"""`stockade serve` shared by tenants (issue 27, item 4): one fills its share, another is still served.

A flooding tenant (tests/helpers/tenant_flood.py, a real client process) keeps
as many acquires waiting on a held scope as the server lets it, asking again as
soon as it is refused. An honest tenant then runs acquire+release 10 times on
fresh connections. Two ways to tell tenants apart: the source address with auth
off (the flood binds 127.0.0.2 and the honest one 127.0.0.3; all of 127/8 is
loopback on Linux, so these model two hosts), and the bearer token with auth on
(both from 127.0.0.1). Then the flood is frozen (SIGSTOP) with its connections
open, and the honest tenant runs 10 more (rule L1: a frozen client's connection
slots stall no one). The control is the same server with the shares off (flag
values past the connection cap): the honest tenant is starved, 0 of 10, live or frozen.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time

import pytest
from conftest import HELPERS, PYTHON, python_env

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

FLOOD_TOKEN = "flood-tenant-token-0123456789abcdef"
HONEST_TOKEN = "honest-tenant-token-0123456789abcdef"
CAP = 48  # --connections-max
SHARE = 16  # the waiting acquires (and, by token, connections) one tenant may hold
FLOOD = 64  # the flooding tenant's connections: more than the cap
OFF = "1000000"  # a share this large is no share: the control


def call(port: int, source: str, method: str, path: str, body: dict | None = None,
         token: str | None = None) -> tuple[int, dict]:
    """One request on a fresh connection from ``source``: (status, document); (0, {"error": ...}) on a reset."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        document = json.loads(data) if data else {}
        if response.status in (429, 503):
            document["retry_after"] = response.getheader("Retry-After")
        return response.status, document
    except OSError as exc:
        return 0, {"error": type(exc).__name__}
    finally:
        conn.close()


def honest_cycles(port: int, source: str, token: str | None, rounds: int = 10) -> tuple[int, list]:
    """Acquire+release ``rounds`` times, each request on a fresh connection: (served, what went wrong)."""
    served, failures = 0, []
    for number in range(rounds):
        status, grant = call(port, source, "POST", "/v1/locks/honest/acquire", {"ttl_ms": 5000}, token)
        if status != 200:
            failures.append((number, "acquire", status, grant))
            continue
        status, answer = call(port, source, "DELETE", f"/v1/leases/{grant['lease_id']}", None, token)
        if status == 204:
            served += 1
        else:
            failures.append((number, "release", status, answer))
    return served, failures


def waiting_on(port: int, source: str, token: str | None) -> int:
    """The waiters on the flooded scope; CAP if the server cannot even answer (its cap is full)."""
    status, document = call(port, source, "GET", "/v1/locks/reports.daily", None, token)
    return int(document.get("waiters", 0)) if status == 200 else CAP


def flooded(serve, tmp_path, *, auth: bool, shares: bool,
            connections_share: bool = True) -> tuple[int, int, list, dict]:
    """Start a server, hold the scope, start the flood, wait until it holds ``SHARE`` waiters, run the honest
    tenant, freeze the flood, run it again. Returns (served of 10, served of 10 with the flood frozen,
    failures, the flood's counts)."""
    flags = ["--connections-max", str(CAP)]
    if auth:
        tokens = tmp_path / "tokens"
        tokens.write_text(f"{FLOOD_TOKEN} reports.*\n{HONEST_TOKEN}\n")
        flags += ["--auth-tokens", str(tokens), "--token-waiters-max", str(SHARE) if shares else OFF,
                  "--token-connections-max", str(SHARE) if shares else OFF]
        flood_source = honest_source = "127.0.0.1"
    else:
        flags += ["--peer-waiters-max", str(SHARE) if shares else OFF]
        if connections_share:  # else the default, the whole cap: room is made from the largest address
            flags += ["--peer-connections-max", str(SHARE + 4) if shares else OFF]
        flood_source, honest_source = "127.0.0.2", "127.0.0.3"
    server = serve(*flags)
    flood_token = FLOOD_TOKEN if auth else None
    honest_token = HONEST_TOKEN if auth else None
    status, _ = call(server.port, flood_source, "POST", "/v1/locks/reports.daily/acquire", {"ttl_ms": 60_000},
                     flood_token)
    assert status == 200
    flood = subprocess.Popen(
        [PYTHON, str(HELPERS / "tenant_flood.py"), "127.0.0.1", str(server.port), "--source", flood_source,
         "--connections", str(FLOOD), "--scope", "reports.daily", "--seconds", "60",
         *(["--token", flood_token] if flood_token else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 20
        while waiting_on(server.port, honest_source, honest_token) < SHARE:  # the flood holds its share (or more)
            assert time.monotonic() < deadline, "the flood never filled its share"
            time.sleep(0.05)
        served, failures = honest_cycles(server.port, honest_source, honest_token)
        os.kill(flood.pid, signal.SIGSTOP)
        try:
            frozen, frozen_failures = honest_cycles(server.port, honest_source, honest_token)
        finally:
            os.kill(flood.pid, signal.SIGCONT)
        out, _ = flood.communicate(input="", timeout=30)  # closing its stdin stops it
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    counts = json.loads(out.strip().splitlines()[-1])
    print(f"\nauth {'on' if auth else 'off'}, shares {'on' if shares else 'OFF (control)'}: honest tenant served "
          f"{served} of 10, {frozen} of 10 with the flood frozen; flood {counts}; first failure {failures[:1]}")
    return served, frozen, failures + frozen_failures, counts


@pytest.mark.parametrize(("auth", "connections_share"), [(False, True), (False, False), (True, True)],
                         ids=["by-address", "by-address-waiters-only", "by-token"])
def test_a_tenant_is_served_while_another_fills_its_share(serve, tmp_path, auth, connections_share):
    served, frozen, failures, counts = flooded(serve, tmp_path, auth=auth, shares=True,
                                               connections_share=connections_share)
    assert (served, frozen) == (10, 10), failures
    # the flood was refused promptly with a problem document, not reset
    assert counts.get("429", 0) > 0, counts


@pytest.mark.parametrize("auth", [False, True], ids=["by-address", "by-token"])
def test_control_without_shares_the_other_tenant_is_starved(serve, tmp_path, auth):
    served, frozen, failures, _ = flooded(serve, tmp_path, auth=auth, shares=False)
    assert (served, frozen) == (0, 0), failures
    # at the cap the new connection is answered 503 with Retry-After, not reset
    assert all(f[2] == 503 and f[3]["retry_after"] == "1" for f in failures), failures[:2]


def long_polls(port: int, source: str, count: int) -> list[http.client.HTTPConnection]:
    """``count`` acquires of the held scope ``s`` waiting 3 s, from ``source``; returns once the server counts
    them (read from another address)."""
    polls = []
    for _ in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
        conn.request("POST", "/v1/locks/s/acquire", body=b'{"ttl_ms": 1000, "wait_ms": 3000}',
                     headers={"Content-Type": "application/json"})
        polls.append(conn)
    deadline = time.monotonic() + 10
    while call(port, "127.0.0.5", "GET", "/v1/locks/s")[1].get("waiters") != count:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return polls


def test_a_share_refusal_is_a_problem_document_with_retry_after(serve):
    server = serve("--peer-waiters-max", "2", "--peer-connections-max", "3")
    port = server.port
    assert call(port, "127.0.0.5", "POST", "/v1/locks/s/acquire", {"ttl_ms": 60_000})[0] == 200
    polls = long_polls(port, "127.0.0.4", 2)  # .4's whole share of waiting acquires
    status, document = call(port, "127.0.0.4", "POST", "/v1/locks/s/acquire", {"ttl_ms": 1000, "wait_ms": 10})
    assert status == 429, document
    assert document["type"].endswith("/limit-exceeded") and document["limit"] == "peer_waiters_max"
    assert document["value"] == 2 and document["retry_after"] == "1"
    # another address is not in this share: it waits (and times out: the scope is held)
    assert call(port, "127.0.0.5", "POST", "/v1/locks/s/acquire", {"ttl_ms": 1000, "wait_ms": 10})[0] == 409
    # connections: .4 holds its 2 long polls + 1 idle connection; one more closes .4's idle one
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=("127.0.0.4", 0))
    idle.request("GET", "/healthz")
    assert idle.getresponse().read() and idle.sock is not None  # answered, kept alive: idle on the server
    assert call(port, "127.0.0.4", "GET", "/healthz")[0] == 200
    assert idle.sock.recv(100) == b""  # closed to make room
    for conn in polls:  # the long polls were never closed: both get their answer (409 at the deadline)
        assert conn.getresponse().status == 409
        conn.close()
    idle.close()


def test_an_address_whose_connections_all_serve_gets_429_at_once(serve):
    server = serve("--peer-connections-max", "2")
    port = server.port
    assert call(port, "127.0.0.5", "POST", "/v1/locks/s/acquire", {"ttl_ms": 60_000})[0] == 200
    polls = long_polls(port, "127.0.0.4", 2)
    status, document = call(port, "127.0.0.4", "GET", "/healthz")
    assert status == 429 and document["limit"] == "peer_connections_max" and document["retry_after"] == "1", (
        status, document)
    assert call(port, "127.0.0.5", "GET", "/healthz")[0] == 200
    for conn in polls:
        assert conn.getresponse().status == 409
        conn.close()


def test_serve_refuses_bad_share_numbers(tmp_path):
    from stockade.core.errors import InvalidArgument
    from stockade.server._guard import TransportSettings

    for name in ("peer_connections_max", "peer_waiters_max", "token_connections_max", "token_waiters_max"):
        for bad in (0, -1, 1_000_001, 2.5, True, "8"):
            with pytest.raises(InvalidArgument, match="must be an integer in 1..1000000"):
                TransportSettings(**{name: bad})
    result = subprocess.run([PYTHON, "-m", "stockade", "serve", "--data-dir", str(tmp_path / "d"), "--port", "0",
                             "--token-waiters-max", "0"], capture_output=True, text=True, timeout=30, env=python_env())
    assert result.returncode != 0 and "token_waiters_max" in result.stderr and "must be" in result.stderr, (
        result.stderr)
    assert "Traceback" not in result.stderr


def test_the_client_raises_limit_exceeded_naming_the_share(serve):
    import stockade

    server = serve("--peer-waiters-max", "1")
    assert call(server.port, "127.0.0.5", "POST", "/v1/locks/s/acquire", {"ttl_ms": 60_000})[0] == 200
    polls = long_polls(server.port, "127.0.0.1", 1)  # the client below connects from 127.0.0.1 too
    coord = stockade.connect(server.url, timeout_ms=5_000)
    try:
        with pytest.raises(stockade.LimitExceeded) as raised:
            coord.acquire("s", ttl_ms=1000, wait_ms=2000, keepalive=False)
        assert raised.value.limit == "peer_waiters_max", raised.value
    finally:
        coord.close()
    polls[0].getresponse().read()
    polls[0].close()
