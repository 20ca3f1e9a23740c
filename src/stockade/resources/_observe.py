"""R5: every rejection is logged and counted, the same way by every adapter.

The log record goes to ``stockade.fence`` with structured fields (resource,
scope, key, token, token_value, high_water, reason) so an operator can find a
fenced-out writer; the count goes to ``stockade_fence_rejections_total{scope,
reason}`` so an alert can fire on a rise. An adapter that rejected a write
calls `reject` and nothing else: it cannot forget either half, nor the
typed error.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from stockade import metrics
from stockade.core.fence import Reject, raise_for
from stockade.core.tokens import FencingToken

__all__ = ["reject", "LOGGER_NAME"]

LOGGER_NAME = "stockade.fence"

_log = logging.getLogger(LOGGER_NAME)


def reject(
    decision: Reject, *, resource: str, cluster: str, token: FencingToken, scope: str, key: str | None
) -> NoReturn:
    """Log and count a rejected write, then raise its typed error.

    Args:
        decision: the fence's `Reject`.
        resource: the adapter's name for itself (e.g. ``sqlite-store:/path``).
        cluster: the cluster the resource trusts (named by `TokenMismatch`).
        token: the rejected token.
        scope: the scope written.
        key: the key written (None for a transaction's admission).

    Raises:
        StaleToken: ``decision.reason == "stale"``.
        TokenMismatch: a token of another scope or cluster.
    """
    _log.warning(
        "%s rejected a write to scope %r: token %d, high-water mark %d (%s)",
        resource, scope, token.value, decision.high_water, decision.reason,
        extra={
            "resource": resource,
            "scope": scope,
            "key": key,
            "token": token.encode(),
            "token_value": token.value,
            "high_water": decision.high_water,
            "reason": decision.reason,
        },
    )
    metrics.FENCE_REJECTIONS.inc(scope=scope, reason=decision.reason)
    raise_for(token, decision, cluster=cluster, scope=scope)
    raise AssertionError("raise_for returned")  # unreachable: raise_for always raises for a Reject
