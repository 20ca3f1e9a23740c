"""Time is an input: the core never reads a clock, it is handed ``now_ns``.

Adapters take a `Clock`; `stockade.clock.SystemClock` reads the host's
monotonic clock and `stockade.testing` provides simulated ones.

Three modules are called ``clock.py``, one per layer, and they are not the same thing: this one is
the protocol, pure, so the core can name it without reading time (the core may not import ``time``);
`stockade.clock` is the one real clock, which reads it; `stockade.testing.clock` holds the simulated
and settable clocks of the public testing kit. The real clock cannot join this module (it reads
``time``), and the simulated ones are not shipped to the code that runs in production.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Clock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic nanoseconds; never goes backwards within one clock."""
        ...
