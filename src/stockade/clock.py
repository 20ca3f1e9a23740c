"""The real clock: the host's monotonic clock (shared by all processes of one boot)."""

from __future__ import annotations

import time

__all__ = ["SystemClock"]


class SystemClock:
    """``CLOCK_MONOTONIC`` in nanoseconds. Never compared across hosts (C3)."""

    def now_ns(self) -> int:
        return time.monotonic_ns()
