"""schemathesis hooks for S23 (loaded with SCHEMATHESIS_HOOKS=server_st_hooks).

JSON Schema counts ``27441.0`` as an integer; stockade's wire contract does not
(floats for integers are rejected, docs/http-api.md). Generated bodies write
whole numbers without a fraction, as every real client does, so that a valid
case is valid under both readings. Invalid cases are unaffected.
"""

from __future__ import annotations

from typing import Any

import schemathesis


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    return _whole(body)
