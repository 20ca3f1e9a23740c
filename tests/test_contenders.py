"""Contenders (``coord.contenders(scope)``, ``GET /v1/locks/{scope}/contenders``): the controls of the
conformance suite's contenders test, and the HTTP route's input, secrecy and scope-limited auth.

The suite's tests (`stockade.testing.conformance.coordinator`) run on every backend in
tests/test_coordinator_conformance.py; here the same check runs against broken client ports
(`stockade.testing.mutants` ``contenders-reversed``, ``contenders-by-name``), and each must fail.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import HELPERS, AsyncRunner, SyncRunner, python_env

import stockade
from stockade.core.limits import CONTENDERS_MAX
from stockade.testing.conformance import coordinator as suite
from stockade.testing.mutants import MUTANTS

sys.path.insert(0, str(HELPERS))
from server_fixtures import request  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

CONTROLS = ("contenders-reversed", "contenders-by-name")
TOKEN = "contenders-test-token-0123456789abcdef"
SCOPED = "contenders-scoped-token-0123456789ab"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_contenders_test_catches_a_line_out_of_serving_order(tmp_path, mode):
    """Control: `check_contenders` over a SQLite coordinator file whose port lists the waiters reversed, or
    sorted by name: each is caught (the waiters' names arrive in neither order)."""
    caught = []
    for name in CONTROLS:
        runner = SyncRunner() if mode == "sync" else AsyncRunner()
        url = f"sqlite:///{tmp_path / f'{name}.db'}?process=embedded"  # the engine's port, wrapped
        handles: list[object] = []  # closed after the failure: the failed check left its leases, and keepalives

        def broken(url: str = url, name: str = name, runner: object = runner,
                   handles: list[object] = handles) -> object:
            handle = runner.connect(url)  # type: ignore[attr-defined]
            MUTANTS[name].wrap(handle._port)
            handles.append(handle)
            return handle

        try:
            with pytest.raises(AssertionError, match="contenders of"):
                suite.check_contenders(runner, broken)
            caught.append(name)
        finally:
            for handle in handles:
                runner.run(handle.aclose() if runner.mode == "async" else handle.close())  # type: ignore[attr-defined]
            if isinstance(runner, AsyncRunner):
                runner.close()
    print(f"contenders controls caught: {len(caught)} of {len(CONTROLS)} ({mode}): {', '.join(caught)}")
    assert caught == list(CONTROLS)


def test_the_route_answers_holder_names_only_and_refuses_bad_input(serve, tmp_path):
    """``GET /v1/locks/{scope}/contenders``: the holder then the waiter, names only (no lease id, no token);
    a bad limit or query is a 400 problem; a scope-limited bearer token reads its scopes only (403 else)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n{SCOPED} reports.*\n")
    server = serve("--auth-tokens", str(tokens))
    admin = {"Authorization": f"Bearer {TOKEN}"}
    scoped = {"Authorization": f"Bearer {SCOPED}"}
    coord = stockade.connect(server.url, auth_token=TOKEN)
    try:
        held = coord.acquire("reports.daily", ttl_ms=10_000, holder="alice")
        other = coord.acquire("payroll", ttl_ms=10_000, holder="bob")
        status, _, body = request(server.url, "GET", "/v1/locks/reports.daily/contenders", headers=scoped)
        assert status == 200, body
        answer = json.loads(body)
        assert answer == {"scope": "reports.daily", "contenders": [{"holder": "alice", "holding": True}]}
        assert held.token.encode() not in body.decode()
        assert [(c.holder, c.holding) for c in coord.contenders("reports.daily")] == [("alice", True)]
        assert request(server.url, "GET", "/v1/locks/payroll/contenders", headers=scoped)[0] == 403
        assert request(server.url, "GET", "/v1/locks/payroll/contenders", headers=admin)[0] == 200
        assert request(server.url, "GET", "/v1/locks/payroll/contenders")[0] == 401
        for query in ("limit=0", f"limit={CONTENDERS_MAX + 1}", "limit=x", "limit=1&limit=2", "after=a"):
            status, _, body = request(server.url, "GET", f"/v1/locks/payroll/contenders?{query}", headers=admin)
            assert status == 400, (query, status, body)
            assert json.loads(body)["type"].endswith("/invalid-argument")
        status, _, body = request(server.url, "GET", "/v1/locks/payroll/contenders?limit=1", headers=admin)
        assert json.loads(body)["contenders"] == [{"holder": "bob", "holding": True}]
        document = json.loads(request(server.url, "GET", "/openapi.json", headers=admin)[2])
        assert document["paths"]["/v1/locks/{scope}/contenders"]["get"]["operationId"] == "lockContenders"
        held.release()
        other.release()
    finally:
        coord.close()


def test_the_lease_leadership_and_semaphore_read_the_same_line(client, tmp_path):
    """``lease.contenders()``, ``leadership.contenders()`` (kazoo's ``Election.contenders()``) and
    ``sem.contenders()`` (per slot) read the coordinator's line: the holder first, then who waits, in order."""
    coord = client.connect(f"memory://{tmp_path.name}")
    leader = client.run(coord.elect("primary", ttl_ms=10_000, identity="node-a:8080"))
    join = suite._in_background(client, suite._acquiring(client, coord, "primary", ttl_ms=10_000,
                                                          wait_ms=30_000, holder="node-b:8080"))
    suite._await_waiters(client, coord, "primary", 1)
    expected = [("node-a:8080", True), ("node-b:8080", False)]
    assert [(c.holder, c.holding) for c in client.run(leader.contenders())] == expected
    assert [(c.holder, c.holding) for c in client.run(leader.lease.contenders())] == expected
    assert [(c.holder, c.holding) for c in client.run(coord.contenders("primary"))] == expected
    with pytest.raises(stockade.InvalidArgument):
        client.run(leader.lease.contenders(limit=0))
    client.run(leader.resign())
    successor, _ = join()
    assert [(c.holder, c.holding) for c in client.run(successor.contenders())] == [("node-b:8080", True)]
    client.run(successor.release())
    sem = (stockade.Semaphore if client.mode == "sync" else stockade.AsyncSemaphore)(coord, "exports", slots=3)
    held = [client.run(sem.acquire(ttl_ms=10_000, holder=f"exporter-{i}")) for i in range(2)]
    line = client.run(sem.contenders())
    assert sorted(line) == sorted(sem.slot_of(lease) for lease in held)
    assert {(c.holder, c.holding) for slot in line.values() for c in slot} == {("exporter-0", True),
                                                                              ("exporter-1", True)}
    for lease in held:
        client.run(lease.release())
    assert client.run(sem.contenders()) == {}
    suite._close(client, coord)


def _status(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "status", "--url", url, *args], capture_output=True,
                          text=True, timeout=60, env=python_env())


def test_status_shows_a_scopes_contenders_in_order(serve, tmp_path):
    """``stockade status --url U SCOPE``: the holder, then the waiter; read-only from a coordinator file (no
    file created), through the client from a served one; a bad scope is a one-line error."""
    server = serve()
    for url in (f"sqlite:///{tmp_path / 'coord.db'}?process=embedded", server.url):
        runner = SyncRunner()
        coord = runner.connect(url)
        held = coord.acquire("reports", ttl_ms=10_000, holder="alice")
        join = suite._in_background(runner, suite._acquiring(runner, coord, "reports", ttl_ms=10_000,
                                                              wait_ms=30_000, holder="bob"))
        suite._await_waiters(runner, coord, "reports", 1)
        before = sorted(tmp_path.iterdir())
        shown = _status(url, "reports", "--json")
        assert shown.returncode == 0, shown.stderr
        assert [json.loads(line) for line in shown.stdout.splitlines()] == [
            {"scope": "reports", "position": 0, "holder": "alice", "holding": True},
            {"scope": "reports", "position": 1, "holder": "bob", "holding": False}]
        assert sorted(tmp_path.iterdir()) == before
        table = _status(url, "reports")
        assert table.returncode == 0 and "1 waiting" in table.stdout, table
        assert [line.split()[1:] for line in table.stdout.splitlines()[2:]] == [["alice", "holding"],
                                                                                 ["bob", "waiting"]]
        bad = _status(url, "bad scope")
        assert bad.returncode != 0 and "scope" in bad.stderr
        held.release()
        lease, _ = join()
        lease.release()
        coord.close()


def test_the_dashboard_of_a_backend_shows_a_waiting_scopes_queue(tmp_path):
    """``stockade ui`` (and ``serve --coordinator``) draws a waiting scope's queue from the backend's contenders:
    the waiters' holder names in serving order, here read-only from a coordinator file."""
    import asyncio

    from stockade.cli.ui import UrlLeases, UrlMarks
    from stockade.server._dashboard_view import View, _rows

    url = f"sqlite:///{tmp_path / 'coord.db'}?process=embedded"
    runner = SyncRunner()
    coord = runner.connect(url)
    held = coord.acquire("reports", ttl_ms=10_000, holder="alice")
    joins = []
    for name in ("zed", "amy"):
        joins.append(suite._in_background(runner, suite._acquiring(runner, coord, "reports", ttl_ms=10_000,
                                                                    wait_ms=30_000, holder=name)))
        suite._await_waiters(runner, coord, "reports", len(joins))
    leases = UrlLeases(url)
    leases.open()
    rows, seen, exact = asyncio.run(_rows(leases, UrlMarks(url, None), View(None)))
    assert seen == 1 and exact
    assert (rows[0]["scope"], rows[0]["holder"], rows[0]["queue"]) == ("reports", "alice", ["zed", "amy"])
    held.release()
    for join in joins:
        lease, _ = join()
        lease.release()
    leases.close()
    coord.close()
