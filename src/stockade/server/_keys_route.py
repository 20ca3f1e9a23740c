"""``GET /v1/admin/verify-keys``: the coordinator's keyring, for a resource host (docs/tokens.md).

A fenced resource beside a remote `stockade serve` needs the keys that verify
its tokens (L2: it refuses to open without them). The keys are HMAC keys:
they verify and mint alike, so whoever holds them is trusted like the
coordinator. Hence the route is for administrators only:

- a server started without ``--auth-tokens`` refuses it (403): anyone who can
  reach the port could otherwise mint tokens;
- a bearer token limited to scopes is refused it (403, `stockade.server._auth`);
- the answer is ``Cache-Control: no-store`` and is never logged (the request
  log records the route and the status only).

The answer is the keyring file's own JSON (`stockade.keys`), so a resource
host can store it as a keyring file and pass its path as ``keys=``
(``stockade keys export``), or hold it in memory (``coord.verify_keys()``).
"""

from __future__ import annotations

from typing import Any

from stockade.keys import FixedKeys, KeyFile, _dump
from stockade.server._http import Request, Response, problem
from stockade.server._inputs import query
from stockade.server._port_leases import PortLeaseService
from stockade.wire import codecs

__all__ = ["verify_keys"]


def verify_keys(app: Any, request: Request) -> Response:
    query(request, ())
    if app.auth is None:
        return problem("unauthorized", "the verify keys can mint tokens: start the server with --auth-tokens "
                       "and call this route with an administrator's token (one without scope patterns)", status=403)
    leases = app.leases
    keys = leases.keys if isinstance(leases, PortLeaseService) else leases.signer
    if not isinstance(keys, (KeyFile, FixedKeys)):
        return problem("backend-unavailable", "this coordinator has no keyring", status=503)
    return Response(200, _dump(keys.keyring), codecs.JSON, [("Cache-Control", "no-store")])
