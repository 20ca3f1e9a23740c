"""Simulated clocks: time is an input, so a test decides what every process believes.

The simulator keeps one true time (`SimTime`, nanoseconds since the start of
the run). Each simulated process reads its own `SimClock` over it: an offset
(hosts boot at different times), a rate error (drift, in parts per million)
and forward jumps (a suspended VM, a stepped clock). A `SimClock` satisfies
`stockade.core.Clock` and is monotonic like the clocks stockade relies on:
it never goes back, so a backward jump is refused.

Pauses (a process stopped by GC, swap or SIGSTOP) are a property of the
process, not of its clock, which keeps running: the simulator holds the
process's events until the pause ends.

`ManualClock` is the plain settable clock for unit tests (like trio's
``MockClock``).

The protocol these satisfy is `stockade.core.clock.Clock`; the real clock is `stockade.clock.SystemClock`.
"""

from __future__ import annotations

from stockade.core.errors import InvalidArgument

__all__ = ["SimTime", "SimClock", "ManualClock", "DRIFT_PPM_MAX"]

#: Largest rate error a `SimClock` accepts: 10 % fast or slow.
DRIFT_PPM_MAX = 100_000


class SimTime:
    """The simulation's true time. Only the scheduler advances it."""

    __slots__ = ("now_ns",)

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = start_ns

    def advance_to(self, t_ns: int) -> None:
        if t_ns < self.now_ns:
            raise InvalidArgument("t_ns", f"true time cannot go back ({t_ns} < {self.now_ns})")
        self.now_ns = t_ns


class SimClock:
    """One process's monotonic clock over true time, with offset, drift and forward jumps.

    Args:
        true_time: the simulation's `SimTime`.
        offset_ns: the clock's reading at true time 0 (boot time differs per host).
        drift_ppm: rate error; +100 means 100 µs fast per second.
    """

    __slots__ = ("_true", "_anchor_true_ns", "_anchor_local_ns", "_rate", "drift_ppm", "jumped_ns")

    def __init__(self, true_time: SimTime, *, offset_ns: int = 0, drift_ppm: int = 0) -> None:
        self._true = true_time
        self._anchor_true_ns = true_time.now_ns
        self._anchor_local_ns = offset_ns + true_time.now_ns
        self.drift_ppm = 0
        self._rate = 1.0
        self.jumped_ns = 0
        self.set_drift(drift_ppm)

    def now_ns(self) -> int:
        """The local monotonic reading, in nanoseconds."""
        return self._anchor_local_ns + int((self._true.now_ns - self._anchor_true_ns) * self._rate)

    def set_drift(self, drift_ppm: int) -> None:
        """Change the rate error from now on (the reading does not jump)."""
        if isinstance(drift_ppm, bool) or not isinstance(drift_ppm, int) or abs(drift_ppm) > DRIFT_PPM_MAX:
            raise InvalidArgument("drift_ppm", f"must be an integer in -{DRIFT_PPM_MAX}..{DRIFT_PPM_MAX}")
        self._anchor_local_ns = self.now_ns()
        self._anchor_true_ns = self._true.now_ns
        self.drift_ppm = drift_ppm
        self._rate = 1.0 + drift_ppm / 1_000_000

    def jump(self, delta_ns: int) -> None:
        """Step the clock forward by ``delta_ns`` (monotonic clocks never step back)."""
        if delta_ns < 0:
            raise InvalidArgument("delta_ns", "a monotonic clock cannot jump backwards")
        self._anchor_local_ns += delta_ns
        self.jumped_ns += delta_ns

    def true_delay_ns(self, local_delay_ns: int) -> int:
        """How much true time passes while this clock advances ``local_delay_ns`` (ignoring jumps)."""
        return max(0, int(local_delay_ns / self._rate) + 1)


class ManualClock:
    """A clock that moves only when told to; for unit tests of code that takes a `Clock`."""

    __slots__ = ("_now_ns",)

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def advance(self, delta_ns: int) -> None:
        if delta_ns < 0:
            raise InvalidArgument("delta_ns", "a monotonic clock cannot go back")
        self._now_ns += delta_ns
