"""``stockade serve --coordinator URL``: the HTTP API over PostgreSQL and etcd (a real server subprocess).

- the conformance suite's core over ``--coordinator postgresql://`` (the whole suite
  runs as the ``serve-postgres`` backend of tests/conftest.py with STOCKADE_LONG=1);
- raw HTTP over etcd: a grant seen by ``stockade status`` on etcd itself, FIFO
  waiters, a disconnected waiter that leaves no grant, an expiry;
- bad input: one line on stderr and exit 1, never a traceback;
- kill -9 of the server while clients hold leases: the backend keeps them, a
  restarted server over a restored store refuses the zombie's writes (0 of N),
  and the control (the same restored store without the backend's floors) accepts them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, ServeProcess, SyncRunner, fresh_pg_url, python_env
from helpers.server_fixtures import request

import stockade
from stockade.coordinators.registry import Capability
from stockade.core.errors import StaleToken
from stockade.core.leases import ScopeState
from stockade.core.tokens import FencingToken
from stockade.resources.store import SQLiteStore
from stockade.testing.conformance.coordinator import (  # the suite's core, over serve --coordinator postgresql://
    test_acquire_release_tokens_increase,
    test_stale_token_rejected_after_newer_grant,
    test_wait_times_out_then_fifo_grant,
)

LONG = os.environ.get("STOCKADE_LONG") == "1"
ZOMBIE_WRITES = 200 if LONG else 20
HOLDERS = 16 if LONG else 4
POLL_S = 0.02
DEADLINE_S = 60

__all__ = [
    "test_acquire_release_tokens_increase", "test_stale_token_rejected_after_newer_grant",
    "test_wait_times_out_then_fifo_grant",
]


@pytest.fixture
def client():
    return SyncRunner()


@pytest.fixture(scope="module")
def module_pg_url():
    """One fresh database for the module's shared server (its tests use scopes of their own)."""
    with fresh_pg_url() as url:
        yield url


@pytest.fixture(scope="module")
def module_server(module_pg_url, tmp_path_factory):
    server = ServeProcess(tmp_path_factory.mktemp("serve-pg"), "--coordinator", module_pg_url)
    yield server
    server.stop()


@pytest.fixture
def coord_url(module_server) -> str:
    return module_server.url


@pytest.fixture
def store_url(module_server) -> str:
    return module_server.url


def _json(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    status, _, raw = request(url, method, path, json_body=body if body is not None else None, timeout=60)
    return status, (json.loads(raw) if raw else {})


def _acquire(url: str, scope: str, *, holder: str, ttl_ms: int = 30_000, wait_ms: int = 0) -> tuple[int, dict]:
    return _json(url, "POST", f"/v1/locks/{scope}/acquire", {"ttl_ms": ttl_ms, "wait_ms": wait_ms, "holder": holder})


def _until(predicate, what: str) -> None:
    """Poll ``predicate`` (bounded): counts and states, not sleeps, decide."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {DEADLINE_S} s: {what}")
        time.sleep(POLL_S)


def _waiters(url: str, scope: str) -> int:
    return _json(url, "GET", f"/v1/locks/{scope}")[1]["waiters"]


# -- etcd, over raw HTTP ---------------------------------------------------------------------------


@pytest.fixture
def etcd_url(etcd_cluster, tmp_path: Path) -> str:
    return f"{etcd_cluster.url}/{tmp_path.name}"


def test_etcd_raw_http_grant_status_fifo(serve, etcd_url):
    server = serve("--coordinator", etcd_url)
    status, first = _acquire(server.url, "jobs", holder="curl-a")
    assert status == 200, first
    shown = subprocess.run([PYTHON, "-m", "stockade", "status", "--url", etcd_url], capture_output=True, text=True,
                           env=python_env(), timeout=60)
    assert shown.returncode == 0 and "curl-a" in shown.stdout, shown.stdout + shown.stderr
    grants: list[tuple[str, dict]] = []

    def wait(name: str) -> None:
        code, doc = _acquire(server.url, "jobs", holder=name, wait_ms=50_000)
        assert code == 200, doc
        grants.append((name, doc))
        assert _json(server.url, "DELETE", f"/v1/leases/{doc['lease_id']}")[0] == 204

    threads = []
    for queued, name in enumerate(("w1", "w2", "w3"), start=1):
        threads.append(threading.Thread(target=wait, args=(name,)))
        threads[-1].start()
        _until(lambda queued=queued: _waiters(server.url, "jobs") == queued, f"{queued} waiters queued")
    assert _json(server.url, "DELETE", f"/v1/leases/{first['lease_id']}")[0] == 204
    for thread in threads:
        thread.join(DEADLINE_S)
    assert [name for name, _ in grants] == ["w1", "w2", "w3"]  # FIFO
    values = [first["token_value"], *(doc["token_value"] for _, doc in grants)]
    assert values == sorted(values) and len(set(values)) == 4


def test_etcd_disconnected_waiter_leaves_no_grant(serve, etcd_url):
    server = serve("--coordinator", etcd_url)
    status, held = _acquire(server.url, "jobs", holder="a")
    assert status == 200
    body = json.dumps({"ttl_ms": 30_000, "wait_ms": 50_000, "holder": "gone"}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/locks/jobs/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _until(lambda: _waiters(server.url, "jobs") == 1, "the raw waiter queued")
    _until(lambda: _waiters(server.url, "jobs") == 0, "the disconnected waiter left the queue")
    assert _json(server.url, "DELETE", f"/v1/leases/{held['lease_id']}")[0] == 204
    _, info = _json(server.url, "GET", "/v1/locks/jobs")
    assert info["state"] == "free" and info["last_token"] == held["token_value"]  # nobody was granted after


def test_etcd_expiry_then_grant(serve, etcd_url):
    server = serve("--coordinator", etcd_url)
    _, lapsed = _acquire(server.url, "jobs", holder="silent", ttl_ms=1000)  # never renewed
    status, next_holder = _acquire(server.url, "jobs", holder="next", wait_ms=30_000)
    assert status == 200 and next_holder["token_value"] > lapsed["token_value"]
    assert _json(server.url, "POST", f"/v1/leases/{lapsed['lease_id']}/renew", {})[0] == 410  # not-holder
    with stockade.connect(server.url) as coord:  # etcd's tokens skip values: the server says so
        assert Capability.DENSE_TOKENS not in coord.capabilities


# -- bad input ---------------------------------------------------------------------------------


def _start_failing(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-m", "stockade", "serve", "--data-dir", str(data_dir), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env(),
                            stdin=subprocess.DEVNULL)


def _one_line_failure(process: subprocess.Popen[str], code: int = 1) -> str:
    """Its one line; ``code``: 1 when the backend refused or could not be reached, 2 for bad input."""
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr and lines[0].startswith("stockade: "), stderr
    return lines[0]


def _serve_fails(data_dir: Path, *args: str, code: int = 1) -> str:
    return _one_line_failure(_start_failing(data_dir, *args), code)


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresq://db/x", "unknown scheme 'postgresq'; use one of etcd, postgres, postgresql, sqlite, zk, zookeeper"),
    ("memory://x", "memory:// cannot be served"),
    ("http://127.0.0.1:1", "http:// cannot be served"),
])
def test_a_url_that_cannot_be_served_is_refused_before_anything(tmp_path, capsys, url, expected):
    from stockade.cli.serve import run

    assert run(["--data-dir", str(tmp_path / "d"), "--port", "0", "--coordinator", url]) == 2  # bad input
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and not (tmp_path / "d").exists(), err


def test_an_unreachable_backend_fails_in_one_line(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens once the socket is closed
    cases = {  # run side by side: each takes its connect attempts
        "cannot connect": f"postgresql://postgres@127.0.0.1:{closed}/x",
        "etcd: no member answered": f"etcd://127.0.0.1:{closed}",
    }
    started = {expected: _start_failing(tmp_path / str(i), "--coordinator", url)
               for i, (expected, url) in enumerate(cases.items())}
    for expected, process in started.items():
        assert expected in _one_line_failure(process)


def test_store_of_another_cluster_is_refused(tmp_path, module_pg_url):
    SQLiteStore(tmp_path / "store.db", cluster_id="0123456789abcdef", keys="unsigned").close()
    assert "differs from the store's cluster" in _serve_fails(tmp_path, "--coordinator", module_pg_url, code=2)


def test_lock_delay_is_mapped_to_the_servers_grants(serve, module_pg_url):
    delayed = serve("--coordinator", module_pg_url, "--lock-delay-ms", "60000")
    _acquire(delayed.url, "delayed", holder="lapses", ttl_ms=100)
    _until(lambda: _json(delayed.url, "GET", "/v1/locks/delayed")[1]["state"] != "held", "the lapse")
    assert _acquire(delayed.url, "delayed", holder="next")[0] == 409  # lock-timeout: the scope is in its delay
    assert _json(delayed.url, "GET", "/v1/locks/delayed")[1]["state"] == "delayed"
    # Control: a client of the same backend without a lock-delay is granted at once after a lapse.
    with stockade.connect(module_pg_url) as plain:
        plain.acquire("other", ttl_ms=1_000, keepalive=False)  # 100 ms lapsed before its renewal at load 21
        _until(lambda: plain.inspect("other").state is not ScopeState.HELD, "the lapse")
        plain.acquire("other", ttl_ms=30_000, keepalive=False)  # granted: no delay after the lapse


# -- kill -9 of the server, a restored store, the zombie ------------------------------------------


def _zombie_accepted(url: str, token: str, scope: str) -> int:
    accepted = 0
    for i in range(ZOMBIE_WRITES):
        status, _, _ = request(url, "PUT", f"/v1/kv/{scope}/z{i}", body=b"stale", headers={"Fencing-Token": token})
        assert status in (200, 409), status
        accepted += status == 200
    return accepted


def test_kill9_backend_keeps_leases_restored_store_refuses_zombie(tmp_path, pg_coord_url):
    data_dir = tmp_path / "serve"
    first = ServeProcess(data_dir, "--coordinator", pg_coord_url)
    try:
        held = [_acquire(first.url, f"s{i}", holder=f"h{i}", ttl_ms=8_000)[1] for i in range(HOLDERS)]
        for doc in held:  # each holder writes once: the store's mark is its token
            status, _, _ = request(first.url, "PUT", f"/v1/kv/{doc['scope']}/k", body=b"v",
                                   headers={"Fencing-Token": doc["token"]})
            assert status == 200
        SQLiteStore(data_dir / "store.db", keys="tokenless").backup(tmp_path / "backup.db")  # admits no token
        first.process.kill()  # SIGKILL by pid
        first.process.wait(30)
    finally:
        first.stop()
    with stockade.connect(pg_coord_url) as coord:
        for doc in held:  # the backend still holds what the dead server granted
            info = coord.inspect(doc["scope"])
            assert info.state is ScopeState.HELD and info.token.value == doc["token_value"], info
        newer = [coord.acquire(doc["scope"], ttl_ms=30_000, wait_ms=60_000, keepalive=False) for doc in held]
        assert all(lease.token.value > doc["token_value"] for lease, doc in zip(newer, held, strict=True))
        keys = coord.verify_keys()
        cluster_id = coord.cluster_id
    for suffix in ("", "-wal", "-shm"):
        (data_dir / f"store.db{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", data_dir / "store.db")  # the restored store: the zombies' marks
    shutil.copy(tmp_path / "backup.db", tmp_path / "control.db")
    second = ServeProcess(data_dir, "--coordinator", pg_coord_url)
    try:
        zombie = held[0]
        accepted = _zombie_accepted(second.url, zombie["token"], zombie["scope"])
        assert accepted == 0, f"{accepted} of {ZOMBIE_WRITES} stale writes accepted"
        assert _json(second.url, "POST", f"/v1/leases/{zombie['lease_id']}/renew", {})[0] == 410
        resumed = _acquire(second.url, "fresh", holder="after")[1]
        headers = {"Fencing-Token": resumed["token"]}
        assert request(second.url, "PUT", "/v1/kv/fresh/k", body=b"v", headers=headers)[0] == 200
    finally:
        second.stop()
    # Control: the same restored store without the backend's floors takes every stale write.
    control = SQLiteStore(tmp_path / "control.db", cluster_id=cluster_id, keys=keys)
    token = FencingToken.decode(zombie["token"])
    accepted = 0
    for i in range(ZOMBIE_WRITES):
        try:
            control.put(zombie["scope"], f"z{i}", b"stale", token=token)
            accepted += 1
        except StaleToken:
            pass
    control.close()
    assert accepted == ZOMBIE_WRITES


def test_a_token_above_the_backends_last_issued_is_refused(module_server, module_pg_url):
    """R5 over a backend: even signed with its keyring, a value nobody issued raises no mark."""
    with stockade.connect(module_server.url) as coord:  # PostgreSQL's tokens are dense: the server says so
        assert Capability.DENSE_TOKENS in coord.capabilities
    with stockade.connect(module_pg_url) as coord:
        lease = coord.acquire("issued", ttl_ms=30_000, keepalive=False)  # granted by the backend, not the server
        keys = coord.verify_keys()
        forged = keys.sign(FencingToken(coord.cluster_id, "issued", lease.token.value + 1000))
        headers = {"Fencing-Token": forged.encode()}
        status, _, body = request(module_server.url, "PUT", "/v1/kv/issued/k", body=b"x", headers=headers)
        assert status == 409 and b"token-mismatch" in body, body
        # Control: the backend's own token, issued after the server last looked, is taken.
        headers = {"Fencing-Token": lease.token.encode()}
        assert request(module_server.url, "PUT", "/v1/kv/issued/k", body=b"x", headers=headers)[0] == 200
