"""R5: every rejection is counted, and logged within a rate limit, the same way by every adapter.

The count goes to ``stockade_fence_rejections_total{reason}``, for every
rejection, so an alert can fire on a rise. The label is the reason alone: a
client that makes up scopes cannot grow the series, nor push an honest
scope's rejections into an overflow series.

The log record goes to ``stockade.fence`` with structured fields (resource,
scope, key, token, token_value, high_water, reason) so an operator can find a
fenced-out writer. A flood of rejections must not flood the log, so at most
`LOG_LINES_PER_INTERVAL` records are written per `LOG_INTERVAL_S` seconds (per
process); the rest are counted, and the first record after the interval says
how many were suppressed, by reason, with a few of their scopes. An adapter
that rejected a write calls `reject` and nothing else: it cannot forget either
half, nor the typed error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import NoReturn

from stockade import metrics
from stockade.core.fence import Reject, raise_for
from stockade.core.tokens import FencingToken

__all__ = ["reject", "LOGGER_NAME", "LOG_LINES_PER_INTERVAL", "LOG_INTERVAL_S", "RejectionLog"]

LOGGER_NAME = "stockade.fence"
LOG_LINES_PER_INTERVAL = 20  # rejection records written per interval (per process)
LOG_INTERVAL_S = 10.0
SAMPLE_SCOPES_MAX = 5  # scopes a suppression summary names

_log = logging.getLogger(LOGGER_NAME)


class RejectionLog:
    """A rate limit on rejection records: at most ``lines`` per ``interval_s``, then one summary.

    Thread-safe. ``clock`` is a monotonic clock in seconds (a seam for tests).
    """

    def __init__(
        self, *, lines: int = LOG_LINES_PER_INTERVAL, interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start: float | None = None
        self._written = 0
        self._suppressed: Counter[str] = Counter()  # by reason: a bounded set
        self._sample: list[str] = []

    def admit(self, scope: str, reason: str) -> tuple[bool, tuple[int, dict[str, int], list[str]] | None]:
        """Whether to write this rejection's record, and the summary of an ended window to write first."""
        with self._lock:
            now = self._clock()
            summary = None
            if self._window_start is None or now - self._window_start >= self.interval_s:
                if self._suppressed:
                    summary = (sum(self._suppressed.values()), dict(self._suppressed), self._sample)
                self._window_start, self._written = now, 0
                self._suppressed, self._sample = Counter(), []
            if self._written < self.lines:
                self._written += 1
                return True, summary
            self._suppressed[reason] += 1
            if len(self._sample) < SAMPLE_SCOPES_MAX and scope not in self._sample:
                self._sample.append(scope)
            return False, summary


_limit = RejectionLog()


def reject(
    decision: Reject, *, resource: str, cluster: str, token: FencingToken, scope: str, key: str | None
) -> NoReturn:
    """Count a rejected write, log it (within the rate limit), then raise its typed error.

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
    metrics.FENCE_REJECTIONS.inc(reason=decision.reason)  # "forged": its detail stays in the log only
    write, summary = _limit.admit(scope, decision.reason)
    if summary is not None:
        count, by_reason, sample = summary
        _log.warning(
            "suppressed %d fence rejection records in the last interval (%s; scopes include %s); "
            "all are counted in stockade_fence_rejections_total",
            count, ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items())), ", ".join(sample),
            extra={"suppressed": count, "suppressed_by_reason": by_reason, "sample_scopes": sample},
        )
    if write:
        _log.warning(
            "%s rejected a write to scope %r: token %d, high-water mark %d (%s%s)",
            resource, scope, token.value, decision.high_water, decision.reason,
            f": {decision.detail}" if decision.detail else "",
            extra={
                "resource": resource,
                "scope": scope,
                "key": key,
                "token": str(token),  # without its MAC: logs never hold a write capability
                "token_value": token.value,
                "high_water": decision.high_water,
                "reason": decision.reason,
            },
        )
    else:
        metrics.FENCE_REJECTION_LOGS_SUPPRESSED.inc()
    raise_for(token, decision, cluster=cluster, scope=scope)
    raise AssertionError("raise_for returned")  # unreachable: raise_for always raises for a Reject
