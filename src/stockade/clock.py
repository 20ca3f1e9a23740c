"""The real clock: the host's monotonic clock (shared by all processes of one boot).

The protocol it satisfies is `stockade.core.clock.Clock` (pure, for the core); the simulated clocks
are `stockade.testing.clock`.
"""

from __future__ import annotations

import time

__all__ = ["SystemClock"]


class SystemClock:
    """``CLOCK_MONOTONIC`` in nanoseconds. Never compared across hosts (C3)."""

    #: ``time.monotonic_ns`` itself: a C call, not a Python frame (the server reads it a few times a request).
    now_ns = staticmethod(time.monotonic_ns)
