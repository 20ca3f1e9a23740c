"""`stockade serve` against real server processes: the wire contract, long polls, bad input, auth, TLS.

Run with ``-s`` to see the figure lines.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from conftest import HELPERS, HTTP_PARSERS

from stockade.core.tokens import FencingToken

sys.path.insert(0, str(HELPERS))
from server_fixtures import request, start_server  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture
def server(tmp_path, request):
    """A fresh server, for a test that reads what the whole server holds or counts (every lock, a metric);
    parametrized indirectly with a parser name, it parses with that one (``--http-parser``)."""
    parser = getattr(request, "param", None)
    proc = start_server(tmp_path / "data", *(["--http-parser", parser] if parser else []))
    yield proc
    assert proc.stop() == 0, proc.logs()[-2000:]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One server for the tests here that look only at scopes of their own or at the documents (started once per
    module and test worker): a test that reads every lock or a metric takes a fresh ``server``."""
    proc = start_server(tmp_path_factory.mktemp("shared") / "data")
    yield proc
    assert proc.stop() == 0, proc.logs()[-2000:]


def call(url, method, path, **kw):
    status, headers, body = request(url, method, path, **kw)
    ctype = headers.get("content-type", "")
    doc = json.loads(body) if ctype.startswith(("application/json", "application/problem+json")) else body
    return status, headers, doc


def acquire(url, scope, ttl_ms=10_000, wait_ms=0, **extra):
    return call(url, "POST", f"/v1/locks/{scope}/acquire", json_body={"ttl_ms": ttl_ms, "wait_ms": wait_ms, **extra})


def put(url, scope, key, value, token, idempotency_key=None):
    headers = {"Fencing-Token": token, "Content-Type": "application/octet-stream"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    return call(url, "PUT", f"/v1/kv/{scope}/{key}", body=value, headers=headers)


# -- the contract ---------------------------------------------------------------------------------


@pytest.mark.parametrize("server", HTTP_PARSERS, indirect=True)
def test_routes_follow_the_contract(server):
    url = server.url
    status, _, grant = acquire(url, "reports", holder="worker-1")
    assert status == 200 and set(grant) == {"scope", "token", "token_value", "lease_id", "ttl_ms"}
    # signed: stk2.<cluster>.<value>.<kid>.<mac>.<scope> (docs/tokens.md)
    assert grant["token"].startswith("stk2.") and grant["token"].endswith(".reports")
    assert grant["token"].split(".")[2] == str(grant["token_value"])
    t1 = grant["token_value"]  # the first token of this opener's epoch; later ones count up from it
    status, _, info = call(url, "GET", "/v1/locks/reports")
    assert status == 200 and info["state"] == "held" and info["holder"] == "worker-1"
    # a read shows the holder's token without its MAC: never a write capability (docs/tokens.md)
    assert info["token"] == FencingToken.decode(grant["token"]).unsigned().encode()
    assert info["last_token"] == t1 and 0 < info["remaining_ms"] <= 10_000

    status, _, result = put(url, "reports", "daily%2Fcsv", b"v1", grant["token"], idempotency_key="op-1")
    assert status == 200 and result == {"scope": "reports", "key": "daily/csv", "token_value": t1, "high_water": t1,
                                        "commit_seq": 1, "replayed": False}
    status, _, again = put(url, "reports", "daily%2Fcsv", b"v1", grant["token"], idempotency_key="op-1")
    assert status == 200 and again["replayed"] is True and again["commit_seq"] == 1
    status, headers, value = call(url, "GET", "/v1/kv/reports/daily%2Fcsv")
    assert status == 200 and value == b"v1" and headers["token-value"] == str(t1) and headers["commit-seq"] == "1"
    status, _, listing = call(url, "GET", "/v1/kv/reports")
    assert listing == {"items": [{"key": "daily/csv", "token_value": t1, "commit_seq": 1, "size": 2}],
                       "next_after": None}
    assert call(url, "GET", "/v1/hwm/reports")[2] == {"scope": "reports", "high_water": t1}

    status, _, renewal = call(url, "POST", f"/v1/leases/{grant['lease_id']}/renew")
    assert status == 200 and renewal == {"scope": "reports", "token": grant["token"], "token_value": t1,
                                         "ttl_ms": 10_000}
    assert call(url, "DELETE", f"/v1/leases/{grant['lease_id']}")[0] == 204
    assert call(url, "DELETE", f"/v1/leases/{grant['lease_id']}")[0] == 204  # idempotent
    status, headers, problem = call(url, "POST", f"/v1/leases/{grant['lease_id']}/renew")
    assert status == 410 and headers["content-type"] == "application/problem+json"
    assert problem["type"].endswith("/not-holder") and grant["lease_id"] not in json.dumps(problem)

    status, _, second = acquire(url, "reports")
    assert second["token_value"] == t1 + 1
    assert put(url, "reports", "k", b"new", second["token"])[0] == 200
    status, _, stale = put(url, "reports", "k", b"zombie", grant["token"])
    assert status == 409 and stale["type"].endswith("/stale-token")
    # the problem document names the token without its MAC (docs/tokens.md)
    assert stale["token"] == FencingToken.decode(grant["token"]).unsigned().encode() and stale["high_water"] == t1 + 1
    status, _, mismatch = put(url, "other", "k", b"x", second["token"])
    assert status == 409 and mismatch["type"].endswith("/token-mismatch") and mismatch["reason"] == "wrong-scope"
    assert call(url, "GET", "/v1/kv/reports/k")[2] == b"new"
    status, _, deleted = call(url, "DELETE", "/v1/kv/reports/k", headers={"Fencing-Token": second["token"]})
    assert status == 200 and deleted["key"] == "k"
    assert call(url, "GET", "/v1/kv/reports/k")[0] == 404

    cluster = call(url, "GET", "/v1/cluster")[2]["cluster_id"]
    assert grant["token"].split(".")[1] == cluster
    assert call(url, "GET", "/healthz")[2] == {"status": "ok"}
    locks = call(url, "GET", "/v1/locks?limit=1")[2]
    assert [lock["scope"] for lock in locks["locks"]] == ["reports"] and locks["next_after"] is None
    openapi = call(url, "GET", "/openapi.json")[2]
    assert openapi["openapi"].startswith("3.1") and "/v1/locks/{scope}/acquire" in openapi["paths"]
    metrics_answer = call(url, "GET", "/metrics")
    assert isinstance(metrics_answer[2], bytes), metrics_answer
    text = metrics_answer[2].decode()
    for name in ("stockade_grants_total 2", "stockade_renewals_total 1", "stockade_fence_rejections_total{",
                 'reason="stale"', "stockade_request_seconds_bucket{", "stockade_wait_seconds",
                 "stockade_expiries_total", "stockade_waits_total", 'stockade_commit_batches_total{file="store"}'):
        assert name in text, name
    assert call(url, "GET", "/v1/nope")[0] == 404
    status, headers, _ = call(url, "PUT", "/v1/locks/reports")
    assert status == 405 and headers["allow"] == "GET"


def test_long_poll_serves_waiters_first_in_first_out(shared):
    url = shared.url
    holder = acquire(url, "fifo")[2]
    results: dict[int, tuple[float, dict]] = {}

    def wait(i):
        status, _, grant = acquire(url, "fifo", ttl_ms=5_000, wait_ms=10_000, holder=f"w{i}")
        results[i] = (time.monotonic(), grant)
        assert status == 200, grant
        time.sleep(0.05)
        call(url, "DELETE", f"/v1/leases/{grant['lease_id']}")

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        time.sleep(0.1)  # enqueue in a known order
    assert call(url, "GET", "/v1/locks/fifo")[2]["waiters"] == 4
    started = time.monotonic()
    call(url, "DELETE", f"/v1/leases/{holder['lease_id']}")
    for t in threads:
        t.join(15)
    order = sorted(results, key=lambda i: results[i][1]["token_value"])
    assert order == [0, 1, 2, 3]
    assert [results[i][1]["token_value"] for i in order] == [holder["token_value"] + k for k in (1, 2, 3, 4)]
    # The head is woken at once by a release: no polling interval in the hand-over.
    assert results[0][0] - started < 0.5
    status, _, timeout = acquire(url, "fifo-2", wait_ms=0)
    status, _, timeout = acquire(url, "fifo-2", wait_ms=200)
    assert status == 409 and timeout["type"].endswith("/lock-timeout")


def test_expiry_wakes_the_head_waiter(server):
    url = server.url
    started = time.monotonic()  # before the first grant: its 300 ms end after this, however late its answer
    first = acquire(url, "exp", ttl_ms=300)[2]["token_value"]
    status, _, grant = acquire(url, "exp", wait_ms=5_000)
    waited = time.monotonic() - started
    # Woken by the expiry: not before the lease's 300 ms, and well before the wait's own 5 s end.
    assert status == 200 and grant["token_value"] == first + 1 and 0.3 <= waited < 4.0
    assert "stockade_expiries_total 1" in call(url, "GET", "/metrics")[2].decode()


def test_disconnected_waiter_leaves_the_queue(shared):
    url = shared.url
    host, port = url.split("//")[1].split(":")
    holder = acquire(url, "gone")[2]
    body = json.dumps({"ttl_ms": 60_000, "wait_ms": 60_000}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/locks/gone/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.3)
    assert call(url, "GET", "/v1/locks/gone")[2]["waiters"] == 1
    sock.close()
    time.sleep(0.3)
    assert call(url, "GET", "/v1/locks/gone")[2]["waiters"] == 0
    call(url, "DELETE", f"/v1/leases/{holder['lease_id']}")
    status, _, grant = acquire(url, "gone")  # no ghost holder: granted at once
    assert status == 200 and grant["token_value"] == holder["token_value"] + 1


# -- bad input changes nothing (S23 hand corpus) --------------------------------------------------


def _state(url, scopes):
    """Every lease and high-water mark and value the corpus could touch."""
    locks = call(url, "GET", "/v1/locks")[2]["locks"]
    for lock in locks:
        lock.pop("remaining_ms")
    hwm = {s: call(url, "GET", f"/v1/hwm/{s}")[2]["high_water"] for s in scopes}
    kv = {s: call(url, "GET", f"/v1/kv/{s}")[2]["items"] for s in scopes}
    return locks, hwm, kv


def _corpus(grant):
    token = grant["token"]
    cluster = token.split(".")[1]
    lease = grant["lease_id"]
    js = {"Content-Type": "application/json"}
    octet = {"Content-Type": "application/octet-stream"}
    bad_tokens = ["-1", "0", str(2**63), "1.5", "NaN", "abc", f"stk1.{cluster}.0.s", f"stk1.{cluster}.-1.s",
                  f"stk1.{cluster}.{2**63}.s", f"stk1.{cluster}.1.5.s", f"stk1.{cluster}.NaN.s",
                  f"stk1.{cluster}.01.s", f"stk1.{cluster}.1.bad scope", "stk1..1.s", "",
                  token.replace("stk2", "stk3"), token.upper()]
    cases = []
    for bad in bad_tokens:
        cases.append(("PUT", "/v1/kv/s/k", {**octet, "Fencing-Token": bad}, b"x"))
        cases.append(("DELETE", "/v1/kv/s/k", {"Fencing-Token": bad}, None))
    cases += [
        ("PUT", "/v1/kv/s/k", octet, b"x"),  # token missing
        # (a PUT value is taken whatever its Content-Type: docs/http-api.md, "Content types")
        ("PUT", "/v1/kv/s/k", {**octet, "Fencing-Token": token, "Idempotency-Key": "has space"}, b"x"),
        ("PUT", "/v1/kv/bad%20scope/k", {**octet, "Fencing-Token": token}, b"x"),
        ("PUT", "/v1/kv/s/%00", {**octet, "Fencing-Token": token}, b"x"),
        ("PUT", "/v1/kv/s/%FF", {**octet, "Fencing-Token": token}, b"x"),
        ("PUT", "/v1/kv/s/" + "k" * 1025, {**octet, "Fencing-Token": token}, b"x"),
        ("PUT", "/v1/kv/s/k", {**octet, "Fencing-Token": token}, b"x" * (1024 * 1024 + 1)),
    ]
    for body in [b'{"ttl_ms": -1}', b'{"ttl_ms": 0}', b'{"ttl_ms": 1000.5}', b'{"ttl_ms": 1e999}',
                 b'{"ttl_ms": NaN}', b'{"ttl_ms": Infinity}', b'{"ttl_ms": "1000"}', b'{"ttl_ms": true}',
                 b'{"ttl_ms": 9223372036854775808}', b'{"ttl_ms": 1000, "ttl_ms": 2000}', b'{}', b'[]', b'1000',
                 b'null', b'{"ttl_ms": 1000, "wait_ms": -1}', b'{"ttl_ms": 1000, "wait_ms": 300001}',
                 b'{"ttl_ms": 1000, "holder": ""}', b'{"ttl_ms": 1000, "holder": "a b"}',
                 b'{"ttl_ms": 1000, "holder": 7}', b'{"ttl_ms": 1000, "extra": 1}', b'{"ttl_ms": 1000',
                 b'\xff\xfe', b"[" * 5000, b'{"ttl_ms": 1' + b"0" * 5000 + b"}", b""]:
        cases.append(("POST", "/v1/locks/s/acquire", js, body))
    cases += [
        ("POST", "/v1/locks/s/acquire", {}, b'{"ttl_ms": 1000}'),  # no content type
        ("POST", "/v1/locks/s/acquire", {"Content-Type": "text/plain"}, b'{"ttl_ms": 1000}'),
        ("POST", "/v1/locks/s/acquire", js, b'{"ttl_ms": 1000, "holder": "' + b"h" * 9000 + b'"}'),  # > 8 KiB
        ("POST", "/v1/locks/bad%2Fscope/acquire", js, b'{"ttl_ms": 1000}'),
        ("POST", "/v1/locks/" + "s" * 201 + "/acquire", js, b'{"ttl_ms": 1000}'),
        ("POST", "/v1/locks/%C3%A9/acquire", js, b'{"ttl_ms": 1000}'),
        ("POST", "/v1/locks/s/acquire?x=1", js, b'{"ttl_ms": 1000}'),
        ("POST", f"/v1/leases/{lease}/renew", js, b'{"extra": 1}'),
        ("POST", f"/v1/leases/{lease}/renew", js, b'{"a": 1, "a": 1}'),
        ("POST", "/v1/leases/short/renew", {}, None),
        ("POST", "/v1/leases/" + "x" * 65 + "/renew", {}, None),
        ("POST", "/v1/leases/bad%24lease%24id%24here%24/renew", {}, None),
        ("POST", "/v1/leases/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/renew", {}, None),  # unknown, well-formed: 410
        ("DELETE", "/v1/leases/short", {}, None),
        ("DELETE", "/v1/leases/" + "x" * 65, {}, None),
        ("DELETE", f"/v1/leases/{lease}", {"Content-Type": "text/plain"}, b"body"),
        ("GET", "/v1/locks/bad%20scope", {}, None),
        ("GET", "/v1/locks?limit=0", {}, None),
        ("GET", "/v1/locks?limit=1.5", {}, None),
        ("GET", "/v1/locks?limit=1&limit=2", {}, None),
        ("GET", "/v1/locks?after=bad%20scope", {}, None),
        ("GET", "/v1/kv/s?limit=-1", {}, None),
        ("GET", "/v1/hwm/bad%20scope", {}, None),
        ("PATCH", "/v1/kv/s/k", {**octet, "Fencing-Token": token}, b"x"),
        ("POST", "/v1/locks/s", js, b'{"ttl_ms": 1000}'),
    ]
    return cases


def _run_corpus(url, cases):
    statuses = []
    for method, path, headers, body in cases:
        status, _, doc = call(url, method, path, headers=headers, body=body)
        statuses.append(status)
        if isinstance(doc, dict) and status >= 400:
            assert doc["status"] == status and doc["type"].startswith("https://stockade.invalid/problems/")
            assert "Traceback" not in json.dumps(doc)
    return statuses


def _corpus_run(url):
    grant = acquire(url, "s")[2]
    assert put(url, "s", "k", b"original", grant["token"])[0] == 200
    before = _state(url, ["s"])
    cases = _corpus(grant)
    statuses = _run_corpus(url, cases)
    after = _state(url, ["s"])
    return cases, statuses, before, after


@pytest.mark.parametrize("server", HTTP_PARSERS, indirect=True)
def test_s23_hand_corpus_gets_4xx_and_changes_nothing(server):
    cases, statuses, before, after = _corpus_run(server.url)
    errors = [(c[0], c[1][:60], s) for c, s in zip(cases, statuses, strict=True) if not 400 <= s < 500]
    changed = int(before != after)
    print(f"\nS23 hand corpus: non-4xx {len(errors)} of {len(cases)} requests; state changed {changed}")
    assert errors == [], errors
    assert before == after


def test_s23_hand_corpus_control_is_caught(tmp_path):
    """The same corpus against a server that applies before it validates: the state check must fail."""
    proc = start_server(tmp_path / "data", control="apply-before-validate")
    try:
        cases, statuses, before, after = _corpus_run(proc.url)
    finally:
        proc.stop()
    print(f"\nS23 control (apply before validate): state changed {int(before != after)}")
    assert before != after


# -- authentication -------------------------------------------------------------------------------

TOKEN = "s3cret-token-0123456789abcdef"


def _auth_attempts(url, grant_token):
    attempts = [{}, {"Authorization": "Bearer wrong-token-0123456789abcdef"}, {"Authorization": f"Basic {TOKEN}"},
                {"Authorization": "Bearer"}, {"Authorization": f"Bearer {TOKEN}x"}]
    statuses = []
    for headers in attempts:
        for method, path, extra, body in [
            ("POST", "/v1/locks/a/acquire", {"Content-Type": "application/json"}, b'{"ttl_ms": 1000}'),
            ("PUT", "/v1/kv/a/k", {"Fencing-Token": grant_token, "Content-Type": "application/octet-stream"}, b"z"),
            ("DELETE", "/v1/kv/a/k", {"Fencing-Token": grant_token}, None),
            ("GET", "/v1/locks/a", {}, None), ("GET", "/metrics", {}, None), ("GET", "/openapi.json", {}, None),
            ("GET", "/v1/nope", {}, None),
        ]:
            status, resp_headers, doc = call(url, method, path, headers={**headers, **extra}, body=body)
            statuses.append(status)
            if status == 401:
                assert doc == {"type": "https://stockade.invalid/problems/unauthorized", "title": "Unauthorized",
                               "status": 401}
                assert resp_headers["www-authenticate"].startswith("Bearer")
    return statuses


def _auth_run(tmp_path, control=None):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# ops team\n{TOKEN}\n\nanother-token-abcdefghijklmnop\n")
    proc = start_server(tmp_path / "data", "--auth-tokens", str(tokens), control=control)
    good = {"Authorization": f"Bearer {TOKEN}"}
    try:
        assert call(proc.url, "GET", "/healthz")[0] == 200
        grant = call(proc.url, "POST", "/v1/locks/a/acquire", json_body={"ttl_ms": 60_000}, headers=good)[2]
        assert call(proc.url, "PUT", "/v1/kv/a/k", body=b"v", headers={
            **good, "Fencing-Token": grant["token"], "Content-Type": "application/octet-stream"})[0] == 200
        state = lambda: (  # noqa: E731
            call(proc.url, "GET", "/v1/locks", headers=good)[2]["locks"][0]["last_token"],
            call(proc.url, "GET", "/v1/kv/a/k", headers=good)[2],
        )
        before = state()
        statuses = _auth_attempts(proc.url, grant["token"])
        after = state()
    finally:
        proc.stop()
    return statuses, before, after


def test_auth_refuses_missing_and_wrong_tokens_and_changes_nothing(tmp_path):
    statuses, before, after = _auth_run(tmp_path)
    print(f"\nauth: non-401 answers {sum(s != 401 for s in statuses)} of {len(statuses)} unauthenticated requests; "
          f"state changed {int(before != after)}")
    assert set(statuses) == {401}
    assert before == after


def test_auth_control_is_caught(tmp_path):
    """A server that checks the token after applying the request: the state check must fail."""
    statuses, before, after = _auth_run(tmp_path, control="auth-after-apply")
    print(f"\nauth control (check after apply): state changed {int(before != after)}")
    assert set(statuses) == {401} and before != after


# -- transport ------------------------------------------------------------------------------------


def test_tls(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    proc = start_server(tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert proc.url.startswith("https://")
        host, port = proc.url.split("//")[1].split(":")
        context = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection(host, int(port), context=context)
        conn.request("POST", "/v1/locks/t/acquire", json.dumps({"ttl_ms": 1000}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["token_value"] >= 1
        with pytest.raises(ssl.SSLError):
            http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context()).request("GET", "/")
    finally:
        proc.stop()


@pytest.mark.parametrize("server", HTTP_PARSERS, indirect=True)
def test_oversize_body_is_refused_before_it_is_read(server):
    host, port = server.url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"POST /v1/locks/s/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000000\r\n\r\n{")
    started = time.monotonic()
    answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5  # not after the 30 s body timeout
    sock.close()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"PUT /v1/kv/s/k HTTP/1.1\r\nHost: x\r\nFencing-Token: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    try:
        for _ in range(20):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except OSError:
        pass
    assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    sock.close()
    assert call(server.url, "GET", "/v1/locks")[2]["locks"] == []


def test_group_commit_shares_transactions(server):
    url = server.url
    grant = acquire(url, "g")[2]
    host, port = url.split("//")[1].split(":")

    def writer(i):
        conn = http.client.HTTPConnection(host, int(port))
        for j in range(20):
            conn.request("PUT", f"/v1/kv/g/k{i}-{j}", b"v", {"Fencing-Token": grant["token"]})
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = call(url, "GET", "/metrics")[2].decode()
    batches = float(text.split('stockade_commit_batches_total{file="store"} ')[1].split()[0])
    ops = float(text.split('stockade_commit_ops_total{file="store"} ')[1].split()[0])
    print(f"\ngroup commit: {ops:g} store writes in {batches:g} transactions")
    assert ops == 320 and batches < ops


def test_lease_ids_never_reach_the_logs(tmp_path):
    proc = start_server(tmp_path / "data", "--log-level", "debug")
    try:
        grants = [acquire(proc.url, f"l{i}", ttl_ms=200)[2] for i in range(3)]
        call(proc.url, "POST", f"/v1/leases/{grants[0]['lease_id']}/renew")
        call(proc.url, "DELETE", f"/v1/leases/{grants[1]['lease_id']}")
        time.sleep(0.3)
        acquire(proc.url, "l2")  # expires grants[2]
        call(proc.url, "POST", f"/v1/leases/{grants[2]['lease_id']}/renew")
    finally:
        assert proc.stop() == 0
    logs = proc.logs()
    lines = [json.loads(line) for line in logs.splitlines() if line.strip()]
    assert lines and all("level" in line and "msg" in line for line in lines)
    for grant in grants:
        assert grant["lease_id"] not in logs
        assert grant["lease_id"][:7] not in logs


def test_openapi_matches_limits(shared):
    doc = call(shared.url, "GET", "/openapi.json")[2]
    acquire_schema = doc["components"]["schemas"]["AcquireRequest"]["properties"]
    assert acquire_schema["ttl_ms"]["minimum"] == 100 and acquire_schema["wait_ms"]["maximum"] == 300_000
    assert "security" not in doc


def test_an_integer_field_takes_every_json_form_of_an_integer(shared):
    # JSON Schema (and so the OpenAPI document) counts 2000.0 and 2e3 as the integer 2000: a
    # schema-valid request is taken (schemathesis found "ttl_ms": 236.0 refused with 422).
    for n, (ttl, wait) in enumerate([("2000.0", "0.0"), ("2e3", "0E5"), ("2000", "-0.0"), ("20000e-1", "0")]):
        status, _, grant = call(shared.url, "POST", f"/v1/locks/f{n}/acquire",
                                body=f'{{"ttl_ms": {ttl}, "wait_ms": {wait}}}'.encode(),
                                headers={"Content-Type": "application/json"})
        assert status == 200 and grant["ttl_ms"] == 2000, (ttl, grant)
    # Not integers, or integers past their bounds: refused, read exactly (never through a float).
    for body in ['{"ttl_ms": 2000.5}', '{"ttl_ms": 1e-3}', '{"ttl_ms": 1e999}', '{"ttl_ms": 3600000.0000000001}',
                 '{"ttl_ms": 9223372036854775808.0}', '{"ttl_ms": 1e21}', '{"ttl_ms": 1000, "wait_ms": 300001.0}']:
        status, _, problem = call(shared.url, "POST", "/v1/locks/g/acquire", body=body.encode(),
                                  headers={"Content-Type": "application/json"})
        assert status == 422 and problem["type"].endswith("/invalid-argument"), (body, problem)
    assert call(shared.url, "GET", "/v1/locks/g")[2]["state"] == "free"


def test_the_document_leaves_out_the_scopes_the_server_refuses(shared):
    # schemathesis (STOCKADE_LONG=1) sent a Fencing-Token whose scope was "." as schema-valid; the server
    # refuses "." and ".." (path steps, not names): the patterns now say so, for paths and tokens alike.
    doc = call(shared.url, "GET", "/openapi.json")[2]
    operation = doc["paths"]["/v1/kv/{scope}/{key}"]["delete"]
    patterns = {p["name"]: re.compile(p["schema"]["pattern"])
                for p in operation["parameters"] if "pattern" in p["schema"]}
    for scope in (".", ".."):
        assert not patterns["scope"].search(scope)
        assert not patterns["Fencing-Token"].search(f"stk1.0123456789abcdef.5.{scope}")
        token = f"stk1.0123456789abcdef.5.{scope}"
        assert call(shared.url, "DELETE", "/v1/kv/x/k", headers={"Fencing-Token": token})[0] == 400
    for scope in ("...", ".a", "a.b"):
        assert patterns["scope"].search(scope) and patterns["Fencing-Token"].search(f"stk1.0123456789abcdef.5.{scope}")


def test_the_documents_links_name_real_operations_and_parameters(shared):
    # The stateful fuzzer follows these links (S23); a link naming a parameter its target does not
    # take would be followed by nobody. Control: a planted wrong name is caught by the same check.
    doc = call(shared.url, "GET", "/openapi.json")[2]
    operations = {op["operationId"]: op for path in doc["paths"].values() for op in path.values()}

    def wrong(links):
        found = []
        for name, link in links.items():
            target = operations.get(link["operationId"])
            taken = {f"{p['in']}.{p['name']}" for p in (target or {}).get("parameters", [])}
            for parameter in link["parameters"]:
                qualified = parameter if "." in parameter else f"path.{parameter}"
                if target is None or qualified not in taken:
                    found.append((name, parameter))
        return found

    links = {f"{op_id}.{name}": link for op_id, op in operations.items()
             for answer in op["responses"].values() for name, link in answer.get("links", {}).items()}
    assert len(links) >= 8 and wrong(links) == []
    assert wrong({"planted": {"operationId": "renew", "parameters": {"lease": "$response.body#/lease_id"}}})


def test_serve_refuses_bad_configuration(tmp_path):
    (tmp_path / "short").write_text("tooshort\n")
    for args in (["--auth-tokens", str(tmp_path / "short")], ["--auth-tokens", str(tmp_path / "missing")],
                 ["--tls-cert", str(tmp_path / "short")], ["--lock-delay-ms", "-1"], ["--release-lag-ms", "-1"],
                 ["--release-lag-ms", "60001"]):
        result = subprocess.run([sys.executable, "-m", "stockade", "serve", "--data-dir",
                                 str(tmp_path / "d"), "--port", "0", *args], capture_output=True, timeout=20)
        assert result.returncode != 0 and b"Traceback" not in result.stderr, (args, result.stderr[-500:])


def test_restart_keeps_tokens_and_state(tmp_path):
    data = tmp_path / "data"
    proc = start_server(data)
    grant = acquire(proc.url, "r", ttl_ms=60_000)[2]
    put(proc.url, "r", "k", b"v", grant["token"])
    assert proc.stop() == 0
    proc = start_server(data)
    try:
        info = call(proc.url, "GET", "/v1/locks/r")[2]
        # C3: held leases stay held; a read shows the token without its MAC (never a write capability)
        assert info["state"] == "held" and info["token"] == FencingToken.decode(grant["token"]).unsigned().encode()
        assert call(proc.url, "POST", f"/v1/leases/{grant['lease_id']}/renew")[0] == 200
        call(proc.url, "DELETE", f"/v1/leases/{grant['lease_id']}")
        assert acquire(proc.url, "r")[2]["token_value"] > grant["token_value"]  # a restart starts a new epoch
        assert call(proc.url, "GET", "/v1/hwm/r")[2]["high_water"] == grant["token_value"]
    finally:
        proc.stop()

