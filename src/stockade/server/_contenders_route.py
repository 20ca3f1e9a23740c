"""``GET /v1/locks/{scope}/contenders``: who holds a scope and who waits for it, in serving order (docs/http-api.md).

The handler of `stockade.server.app.App` for the route ``lockContenders``. On the
server's own coordinator file the line is read from the lease table after the
server's pending writes are durable (`stockade.server._leases.LeaseService.contenders`);
behind ``--coordinator`` it is the backend's queue, read through its port
(`stockade.server._port_leases.PortLeaseService.contenders`). Only holder names
leave: lease ids and tokens are secrets. A bearer token limited to scope
patterns reads only the scopes it covers (the route has ``{scope}``: the auth
check of `stockade.server._auth.BearerAuth.refusal` applies).
"""

from __future__ import annotations

from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.limits import CONTENDERS_MAX, validate_scope
from stockade.server._http import Request, Response, json_response
from stockade.server._inputs import query, segment
from stockade.wire import codecs

__all__ = ["lock_contenders"]


def _limit(params: dict[str, str]) -> int:
    raw = params.get("limit")
    if raw is None:
        return CONTENDERS_MAX
    if not raw.isascii() or not raw.isdigit() or len(raw) > 5 or not 1 <= int(raw) <= CONTENDERS_MAX:
        raise InvalidArgument("limit", f"must be an integer in 1..{CONTENDERS_MAX}")
    return int(raw)


async def lock_contenders(app: Any, request: Request, raw_scope: str) -> Response:
    scope = validate_scope(segment(raw_scope, "scope"))
    limit = _limit(query(request, ("limit",)))
    line = await app.leases.contenders(scope, limit)
    return json_response(200, codecs.contenders_doc(scope, line))
