"""``GET /v1/locks/{scope}/history``: a scope's journal of grants, expiries and releases (docs/history.md).

The handler of `stockade.server.app.App` for the route ``lockHistory``. On the
server's own coordinator file, the events are read after the server's pending
writes are durable, so it shows what has committed and nothing a crash could
take back; behind ``--coordinator``, they are the backend's journal, read
through its port (`stockade.server._port_leases.PortLeaseService.history`).
"""

from __future__ import annotations

from typing import Any

from stockade.coordinators.journal import HISTORY_PER_SCOPE
from stockade.core.errors import InvalidArgument
from stockade.core.limits import validate_scope
from stockade.server._http import Request, Response, json_response
from stockade.server._inputs import query, segment

__all__ = ["lock_history"]


def _limit(params: dict[str, str]) -> int:
    raw = params.get("limit")
    if raw is None:
        return HISTORY_PER_SCOPE
    if not raw.isascii() or not raw.isdigit() or len(raw) > 4 or not 1 <= int(raw) <= HISTORY_PER_SCOPE:
        raise InvalidArgument("limit", f"must be an integer in 1..{HISTORY_PER_SCOPE}")
    return int(raw)


async def lock_history(app: Any, request: Request, raw_scope: str) -> Response:
    scope = validate_scope(segment(raw_scope, "scope"))
    limit = _limit(query(request, ("limit",)))
    events = await app.leases.history(scope, limit)
    return json_response(200, {"scope": scope, "events": [event.as_json() for event in events]})
