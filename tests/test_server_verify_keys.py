"""``GET /v1/admin/verify-keys``: how a resource host beside a `stockade serve` gets the keys that verify
its tokens (L2; docs/tokens.md), with a real ``stockade serve`` subprocess.

The keys can mint tokens, so the route answers only an administrator: a bearer token without scope
patterns, on a server started with ``--auth-tokens``. A scope-limited token is refused (403) though it
may call the other unscoped routes it is allowed (``/v1/cluster``: 200, the contrast); a server without
auth refuses everyone (403). The route is in the OpenAPI document, and the keys never reach the log,
not even at ``--log-level debug``.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.server_fixtures import request

import stockade
from stockade.core.errors import Unauthorized
from stockade.core.tokens import FencingToken
from stockade.keys import KeyFile, load_keyring
from stockade.resources.files import FencedDirectory

ADMIN = "admin-token-7d1e2f3a4b5c6d7e"
SCOPED = "reports-token-2f6a9c1d7e8b0a4f"
ROUTE = "/v1/admin/verify-keys"


@pytest.fixture
def server(serve, tmp_path: Path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN}\n{SCOPED} reports.*\n")
    return serve("--auth-tokens", str(tokens), "--log-level", "debug")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_only_an_administrator_gets_the_keyring(server) -> None:
    on_disk = load_keyring(server.data_dir / "coord.keys")
    status, headers, body = request(server.url, "GET", ROUTE, headers=_bearer(ADMIN))
    assert status == 200 and headers["cache-control"] == "no-store"
    doc = json.loads(body)
    assert doc["kind"] == "stockade-keyring" and doc["cluster_id"] == on_disk.cluster_id
    assert [k["kid"] for k in doc["keys"]] == [k.kid for k in on_disk.keys]
    assert request(server.url, "GET", "/v1/cluster", headers=_bearer(SCOPED))[0] == 200  # the contrast
    assert request(server.url, "GET", ROUTE, headers=_bearer(SCOPED))[0] == 403
    assert request(server.url, "GET", ROUTE)[0] == 401
    assert request(server.url, "GET", ROUTE, headers=_bearer("not-a-token-at-all-000"))[0] == 401
    assert request(server.url, "GET", ROUTE + "?x=1", headers=_bearer(ADMIN))[0] == 400


def test_a_server_without_auth_hands_the_keys_to_no_one(serve) -> None:
    server = serve()
    status, _, body = request(server.url, "GET", ROUTE)
    assert status == 403 and b"--auth-tokens" in body
    coord = stockade.connect(server.url)
    with pytest.raises(Unauthorized):
        coord.verify_keys()
    coord.close()


def test_the_route_is_in_the_openapi_document(server) -> None:
    status, _, body = request(server.url, "GET", "/openapi.json", headers=_bearer(ADMIN))
    operation = json.loads(body)["paths"][ROUTE]["get"]
    assert status == 200 and operation["operationId"] == "verifyKeys"
    assert {"200", "403"} <= set(operation["responses"])


def test_verify_keys_of_a_remote_coordinator_verifies_and_the_keys_never_reach_the_log(server, tmp_path) -> None:
    """``coord.verify_keys()`` on ``http://`` (sync and async): a resource host fences with it; a forged
    max-value token is refused, an honest one accepted; the scope-limited token gets `Unauthorized`."""
    coord = stockade.connect(server.url, auth_token=ADMIN)
    keys = coord.verify_keys()
    directory = FencedDirectory(tmp_path / "files", keys=keys)
    with coord.lock("reports", ttl_ms=5_000) as lease:
        directory.write("daily.csv", b"honest", lease.token)
    with pytest.raises(stockade.TokenMismatch):
        directory.write("daily.csv", b"forged", FencingToken(coord.cluster_id, "reports", 2**63 - 1))
    scoped = stockade.connect(server.url, auth_token=SCOPED)
    with pytest.raises(Unauthorized):
        scoped.verify_keys()
    scoped.close()
    coord.close()

    async def fetched() -> object:
        async with stockade.connect_async(server.url, auth_token=ADMIN) as acoord:
            return acoord.verify_keys()

    import asyncio

    assert asyncio.run(fetched()).keyring.cluster_id == keys.keyring.cluster_id  # type: ignore[attr-defined]
    log = (server.data_dir / "serve.log").read_text()
    assert ROUTE in log  # the requests were logged (debug: one line each), their answers not
    for key in load_keyring(server.data_dir / "coord.keys").keys:
        for shown in (base64.urlsafe_b64encode(key.secret).decode(), key.secret.hex()):
            assert shown not in log


def test_keys_export_writes_a_keyring_a_resource_host_verifies_with(server, tmp_path) -> None:
    out = tmp_path / "host" / "coord.keys"
    out.parent.mkdir()
    env = {**os.environ, "STOCKADE_AUTH_TOKEN": ADMIN, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "stockade", "keys", "export", "--url", server.url, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    keys = KeyFile(out)
    assert keys.cluster_id == load_keyring(server.data_dir / "coord.keys").cluster_id
    refused = subprocess.run([sys.executable, "-m", "stockade", "keys", "export", "--url", server.url, "--out",
                              str(tmp_path / "x.keys")], env={**env, "STOCKADE_AUTH_TOKEN": SCOPED},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and not (tmp_path / "x.keys").exists()
