"""The HTTP API's contract as data, shared by the server and the remote client (docs/http-api.md).

Pure like `stockade.core` (no I/O, no clocks, no event loop; a test checks
its imports): it says what goes over the wire, and the server and the client
do the moving.

- `routes`: the route table (method, path template, operation id, what each
  takes and answers, auth, its problems). The server dispatches from it,
  ``/openapi.json`` is rendered from it, the client builds its targets from it.
- `problems`: the problem-type prefix and catalogue (code, title, status);
  exceptions to documents (server) and back (client, `error_for`).
- `codecs`: the JSON documents (grants, leases, lock infos, write results,
  pages) encoded by the server and decoded by the client.

Imports point one way: ``core`` <- ``wire`` <- ``client``, ``server``.
"""

from __future__ import annotations

from stockade.wire.problems import PROBLEM_TYPE_PREFIX, PROBLEM_TYPES, ProblemType, RemoteProblem, error_for
from stockade.wire.routes import ROUTE, ROUTES, Route, match

__all__ = [
    "DEFAULT_PORT",
    "API_VERSION",
    "ROUTES",
    "ROUTE",
    "Route",
    "match",
    "PROBLEM_TYPE_PREFIX",
    "PROBLEM_TYPES",
    "ProblemType",
    "RemoteProblem",
    "error_for",
]

# The port `stockade serve` listens on unless told otherwise, and the one examples use.
DEFAULT_PORT = 7390
API_VERSION = "1"
