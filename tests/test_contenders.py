"""Contenders (``coord.contenders(scope)``, ``GET /v1/locks/{scope}/contenders``): the controls of the
conformance suite's contenders test, and the HTTP route's input, secrecy and scope-limited auth.

The suite's tests (`stockade.testing.conformance.coordinator`) run on every backend in
tests/test_coordinator_conformance.py; here the same check runs against broken client ports
(`stockade.testing.mutants` ``contenders-reversed``, ``contenders-by-name``), and each must fail.
"""

from __future__ import annotations

import json
import sys

import pytest
from conftest import HELPERS, AsyncRunner, SyncRunner

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
        url = f"sqlite:///{tmp_path / f'{name}.db'}"

        def broken(url: str = url, name: str = name, runner: object = runner) -> object:
            handle = runner.connect(url)  # type: ignore[attr-defined]
            MUTANTS[name].wrap(handle._port)
            return handle

        try:
            with pytest.raises(AssertionError, match="contenders of"):
                suite.check_contenders(runner, broken)
            caught.append(name)
        finally:
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
