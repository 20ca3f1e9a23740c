"""One wire contract (`stockade.wire`): the server dispatches every route of the table, /openapi.json
documents every one, the client builds its targets only from it, and every problem type comes back to
the client as the exception the server raised. Each check has a control that fails.
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import HELPERS

import stockade.client
from stockade.client._shared import http_endpoint
from stockade.coordinators.http._sync.port import HTTPCoordinatorPort, HTTPStorePort, fetch_cluster_id
from stockade.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvariantViolation,
    LimitExceeded,
    LockTimeout,
    NotHolder,
    StaleToken,
    StockadeError,
    TokenMismatch,
    Unauthorized,
)
from stockade.core.tokens import FencingToken
from stockade.server.app import App, _handler_name, problem_for
from stockade.server.openapi import openapi_document
from stockade.transport._sync.http_client import HTTPClient
from stockade.transport.http11 import HTTPResponse, error_for
from stockade.wire import DEFAULT_PORT, PROBLEM_TYPE_PREFIX
from stockade.wire.problems import BODY_FIELD_STATUS, PROBLEM_TYPES, SIZE_STATUS
from stockade.wire.routes import ROUTE, ROUTES, Answer, Route, match, missing_handlers

sys.path.insert(0, str(HELPERS))
from server_fixtures import request, start_server  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

CLUSTER = "0123456789abcdef"
SAMPLE = {"scope": "wire-s", "lease_id": "A" * 32, "key": "a/b c"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = start_server(tmp_path_factory.mktemp("wire") / "data")
    yield proc
    assert proc.stop() == 0, proc.logs()[-2000:]


# -- the server dispatches every route, and documents it ------------------------------------------


def _undispatched(url: str, routes: tuple[Route, ...]) -> list[str]:
    """Operation ids whose request the server answers as an unknown route (404 'no such route') or method (405)."""
    missing = []
    for route in routes:
        target = route.target(**{name: SAMPLE[name] for name in route.path_params})
        status, _, body = request(url, route.method, target, timeout=10)
        unknown_route = status == 404 and b"no such route" in body
        if unknown_route or status == 405:
            missing.append(route.operation_id)
    return missing


def _undocumented(document: dict, routes: tuple[Route, ...]) -> list[str]:
    missing = []
    for route in routes:
        operation = document["paths"].get(route.path, {}).get(route.method.lower())
        if operation is None or operation["operationId"] != route.operation_id:
            missing.append(route.operation_id)
    return missing


def test_every_route_is_dispatched_and_documented(server):
    assert _undispatched(server.url, ROUTES) == []
    status, _, body = request(server.url, "GET", "/openapi.json")
    document = json.loads(body)
    assert status == 200 and _undocumented(document, ROUTES) == []
    documented = {(path, method.upper()) for path, item in document["paths"].items() for method in item}
    assert documented == {(route.path, route.method) for route in ROUTES}  # and nothing beyond the table


def test_undispatched_route_control_is_caught(server):
    # the control: a route the server does not have is reported by the same check
    nowhere = Route("GET", "/v1/nowhere/{scope}", "nowhere", "Nothing.")
    wrong_method = Route("PATCH", "/v1/locks/{scope}", "patchLock", "Nothing.")
    assert _undispatched(server.url, (*ROUTES, nowhere, wrong_method)) == ["nowhere", "patchLock"]
    document = openapi_document(auth=False, value_bytes_max=1024)
    assert _undocumented(document, (*ROUTES, nowhere)) == ["nowhere"]


def test_app_refuses_a_table_route_without_handler():
    handlers = {route.operation_id: getattr(App, _handler_name(route.operation_id)) for route in ROUTES}
    assert missing_handlers(handlers) == []
    assert App.handlers_of(types.SimpleNamespace(**{_handler_name(op): h for op, h in handlers.items()}))
    # the control: a dispatcher that lost one handler does not start
    del handlers["renew"]
    assert missing_handlers(handlers) == ["renew"]
    incomplete = types.SimpleNamespace(**{_handler_name(op): h for op, h in handlers.items()})
    with pytest.raises(TypeError, match="renew"):
        App.handlers_of(incomplete)


def test_matching_follows_the_table():
    for route in ROUTES:
        target = route.target(**{name: SAMPLE[name] for name in route.path_params})
        found = match(target)
        assert found is not None and found.template == route.path and route.method in found.methods
        decoded = tuple(p.replace("%2F", "/").replace("%20", " ") for p in found.params)
        assert decoded == tuple(SAMPLE[name] for name in route.path_params)
    assert match("/v1/kv/s/a/b/c").params == ("s", "a/b/c")  # a key may hold '/' unencoded
    assert match("/v1/nowhere") is None and match("/v2/locks/s") is None and match("/v1") is None


def test_every_problem_answer_is_in_the_catalogue():
    for route in ROUTES:
        for answer in route.problems:
            assert isinstance(answer, Answer)
            for code in answer.codes:
                usual = PROBLEM_TYPES[code].status
                # "unauthorized" is also 403: a known token outside its scopes, or not an administrator's
                second = {"invalid-argument": BODY_FIELD_STATUS, "limit-exceeded": SIZE_STATUS,
                          "unauthorized": 403}.get(code)
                assert answer.status in (usual, second), (route.operation_id, code, answer.status)


# -- the client takes its paths from the table ----------------------------------------------------


def _path_literals(source: str) -> list[str]:
    """String constants (f-string parts included) that look like a path of the API."""
    heads = {route.path.split("/")[1] for route in ROUTES} - {""}
    found = []
    for node in ast.walk(ast.parse(source)):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/")
        if is_text and node.value.split("/")[1].split("?")[0] in heads:
            found.append(node.value)
    return found


def test_client_code_writes_no_path():
    client_dir = Path(stockade.client.__file__).parent
    files = sorted(client_dir.rglob("*.py"))
    assert len(files) > 5
    for path in files:
        assert _path_literals(path.read_text()) == [], path.name


def test_path_literal_control_is_caught():
    source = 'async def f(scope):\n    return await get(f"/v1/locks/{scope}"), "/healthz", "/metrics?x"\n'
    assert sorted(_path_literals(source)) == ["/healthz", "/metrics?x", "/v1/locks/"]


class _Recording(HTTPClient):
    sent: ClassVar[list[tuple[str, str]]] = []

    def request(self, method, path, **kw):  # type: ignore[no-untyped-def, override]
        self.sent.append((method, path))
        return super().request(method, path, **kw)


def test_client_requests_are_table_routes(server):
    client = _Recording(http_endpoint(server.url))
    _Recording.sent = []
    cluster_id = fetch_cluster_id(client)
    coordinator = HTTPCoordinatorPort(client, cluster_id=cluster_id)
    store = HTTPStorePort(client, cluster_id=cluster_id)
    grant = coordinator.acquire("wire-c", holder="w", ttl_ms=5_000, wait_ms=0)
    coordinator.renew(grant.lease_id)
    store.put("wire-c", "a/b c", b"v", token=grant.token, idempotency_key=None)
    assert store.list("wire-c", after="", limit=10)[0].value == b"v"
    assert store.high_water("wire-c") == grant.token.value
    store.delete("wire-c", "a/b c", token=grant.token, idempotency_key=None)
    assert [info.scope for info in coordinator.scopes(after="", limit=10)] == ["wire-c"]
    coordinator.inspect("wire-c")
    coordinator.release(grant.lease_id)
    client.close()
    used = set()
    for method, target in _Recording.sent:
        found = match(target.split("?", 1)[0])
        assert found is not None and method in found.methods, (method, target)
        used.add(found.methods[method].operation_id)
    assert used == {"cluster", "acquire", "renew", "put", "listKeys", "get", "highWater", "deleteKey",
                    "listLocks", "inspectLock", "release"}


# -- problem types round-trip from the server's exception to the client's -------------------------


TOKEN = FencingToken(CLUSTER, "s", 5)

ERRORS: list[tuple[StockadeError | InvariantViolation, type[StockadeError | InvariantViolation]]] = [
    (InvalidArgument("ttl_ms", "too small"), InvalidArgument),
    (LimitExceeded("waiters_max", 64), LimitExceeded),
    (StaleToken(TOKEN, 9), StaleToken),
    (TokenMismatch(TOKEN, "wrong-scope", "t"), TokenMismatch),
    (LockTimeout("s", 250), LockTimeout),
    (NotHolder("abcdef"), NotHolder),
    (Unauthorized("no"), Unauthorized),
    (BackendUnavailable("disk full"), BackendUnavailable),
    (InvariantViolation("a bug"), InvariantViolation),
]


def _round_trip(error: StockadeError | InvariantViolation, **kw: object) -> StockadeError | InvariantViolation:
    response = problem_for(error, **kw)  # type: ignore[arg-type]
    document = json.loads(response.body)
    assert document["type"] == PROBLEM_TYPE_PREFIX + error.code
    assert document["status"] == response.status and document["title"] == PROBLEM_TYPES[error.code].title
    back, problem = error_for(HTTPResponse(response.status, {}, response.body), scope="s", wait_ms=250,
                              lease_id="abcdef" + "x" * 26, token=TOKEN)
    assert problem.status == response.status and problem.problem == document
    return back


@pytest.mark.parametrize(("error", "expected"), ERRORS, ids=lambda e: getattr(e, "code", None))
def test_problem_types_round_trip(error, expected):
    back = _round_trip(error)
    assert type(back) is expected
    if isinstance(error, StaleToken):
        assert back.token == TOKEN and back.high_water == 9
    elif isinstance(error, TokenMismatch):
        assert back.reason == "wrong-scope"
    elif isinstance(error, InvalidArgument):
        assert back.field == "ttl_ms"
    elif isinstance(error, LimitExceeded):
        assert back.limit == "waiters_max"
    elif isinstance(error, LockTimeout):
        assert (back.scope, back.wait_ms) == ("s", 250)


def test_every_catalogued_code_maps_to_an_exception():
    for code, problem in PROBLEM_TYPES.items():
        body = json.dumps({"type": problem.uri, "title": problem.title, "status": problem.status}).encode()
        error, _ = error_for(HTTPResponse(problem.status, {}, body))
        # a server's bug stays a bug on the client: outside the tree that callers handle
        assert isinstance(error, InvariantViolation if code == "invariant-violation" else StockadeError), code
        if code in {e.code for e, _ in ERRORS}:
            assert error.code == code


def test_round_trip_control_is_caught():
    # the control: a document under another prefix is not recognised, and lands on the status fallback
    response = problem_for(StaleToken(TOKEN, 9))
    foreign = response.body.replace(PROBLEM_TYPE_PREFIX.encode(), b"https://elsewhere.invalid/p/")
    error, _ = error_for(HTTPResponse(response.status, {}, foreign))
    assert not isinstance(error, StaleToken)


def test_body_field_is_422_and_still_invalid_argument():
    back = _round_trip(InvalidArgument("holder", "bad"), body_field=True)
    assert type(back) is InvalidArgument and back.field == "holder"
    assert problem_for(InvalidArgument("holder", "bad"), body_field=True).status == BODY_FIELD_STATUS


def test_default_port_is_the_servers():
    from stockade.server import ServerConfig

    assert ServerConfig(data_dir=Path(".")).port == DEFAULT_PORT
    assert ROUTE["acquire"].target(scope="s") == "/v1/locks/s/acquire"
