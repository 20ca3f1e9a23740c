"""R5: every rejection is counted, and logged within a bound that junk cannot spend, the same way by every adapter.

The count goes to ``stockade_fence_rejections_total{reason}``, for every
rejection, so an alert can fire on a rise. The label is the reason alone: a
client that makes up scopes cannot grow the series, nor push an honest
scope's rejections into an overflow series.

The log record goes to ``stockade.fence`` with structured fields (resource,
scope, key, token, token_value, high_water, reason) so an operator can find a
fenced-out writer. A flood of rejections must neither flood the log nor hide
the one record that matters, so in each `LOG_INTERVAL_S` window (per process):

- the first rejection of each (scope, reason) is logged, for up to
  `SCOPES_PER_REASON_MAX` scopes per reason; repeats of a pair already logged
  in the window are not (a zombie retrying a thousand times is one line);
- so at most `LOG_LINES_PER_INTERVAL` records a window, plus one summary,
  and the window remembers at most that many pairs, whatever the number of
  scopes a flood makes up;
- the first record after a window says how many rejections it did not log,
  by reason, with a few of their scopes (``N more rejections not logged``).

Why per reason: the junk a writer without the coordinator's keys can send is
refused as ``forged`` (made-up tokens, on made-up scopes or real ones), and it
spends the ``forged`` share only. A ``stale`` refusal needs a token the
coordinator issued for that scope, a ``wrong-scope`` one a token issued for
another, so a junk flood cannot hide an honest scope's stale write: that
scope's first one in the window is logged. (Without keys, in unsigned mode, a
writer can make up any token, and nothing on the resource tells honest scopes
from invented ones; the counter still counts every rejection.) The limit
this replaces held all reasons and scopes together to 20 records per 10 s:
10,000 junk rejections left no record of an honest scope's stale write.

An adapter that rejected a write calls `reject` and nothing else: it cannot
forget either half, nor the typed error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import NoReturn, get_args

from stockade import metrics
from stockade.core.fence import Reject, RejectReason, raise_for
from stockade.core.tokens import FencingToken

__all__ = [
    "reject", "LOGGER_NAME", "LOG_LINES_PER_INTERVAL", "LOG_INTERVAL_S", "SCOPES_PER_REASON_MAX", "RejectionLog",
]

LOGGER_NAME = "stockade.fence"
LOG_INTERVAL_S = 10.0
SCOPES_PER_REASON_MAX = 32  # scopes whose first rejection of a reason is logged, per interval (per process)
REASONS = get_args(RejectReason)
LOG_LINES_PER_INTERVAL = SCOPES_PER_REASON_MAX * len(REASONS)  # 128 records at most, + 1 summary
SAMPLE_SCOPES_MAX = 5  # scopes a suppression summary names

_log = logging.getLogger(LOGGER_NAME)

Summary = tuple[int, dict[str, int], list[str]]


class RejectionLog:
    """Which rejections get a record: the first of each (scope, reason) per window, ``scopes_per_reason`` at most.

    Thread-safe. ``clock`` is a monotonic clock in seconds (a seam for tests).
    Memory: at most ``scopes_per_reason`` scopes per reason, and
    `SAMPLE_SCOPES_MAX` sample scopes, whatever the flood.
    """

    def __init__(
        self, *, scopes_per_reason: int = SCOPES_PER_REASON_MAX, interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scopes_per_reason = scopes_per_reason
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start: float | None = None
        self._logged: dict[str, set[str]] = {}  # reason -> scopes logged in this window (bounded, each)
        self._suppressed: Counter[str] = Counter()  # by reason: a bounded set
        self._sample: list[str] = []

    def admit(self, scope: str, reason: str) -> tuple[bool, Summary | None]:
        """Whether to write this rejection's record, and the summary of an ended window to write first."""
        with self._lock:
            summary = self._roll(self._clock())
            logged = self._logged.setdefault(reason, set())
            if scope not in logged and len(logged) < self.scopes_per_reason:
                logged.add(scope)
                return True, summary
            self._suppressed[reason] += 1
            if len(self._sample) < SAMPLE_SCOPES_MAX and scope not in self._sample:
                self._sample.append(scope)
            return False, summary

    def _roll(self, now: float) -> Summary | None:
        """Start a new window if this one ended; returns the ended window's summary (None: nothing left out)."""
        if self._window_start is not None and now - self._window_start < self.interval_s:
            return None
        summary = (sum(self._suppressed.values()), dict(self._suppressed), self._sample) if self._suppressed else None
        self._window_start = now
        self._logged, self._suppressed, self._sample = {}, Counter(), []
        return summary


_limit = RejectionLog()


def reject(
    decision: Reject, *, resource: str, cluster: str, token: FencingToken, scope: str, key: str | None
) -> NoReturn:
    """Count a rejected write, log it (if `RejectionLog` admits it), then raise its typed error.

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
            "%d more fence rejections not logged in the last interval (%s; scopes include %s); "
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
