"""Time is an input: the core never reads a clock, it is handed ``now_ns``.

Adapters take a `Clock`; `stockade.clock.SystemClock` reads the host's
monotonic clock and `stockade.testing` provides simulated ones.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Clock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic nanoseconds; never goes backwards within one clock."""
        ...
