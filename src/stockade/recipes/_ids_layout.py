"""The bit layout of a Snowflake id, and the errors of `stockade.recipes.ids`.

An id is one non-negative 63-bit integer:

    | timestamp (units since the epoch) | worker number | sequence |
      timestamp_bits                      worker_bits     sequence_bits

so ids of one generator increase with time, and two generators with
different worker numbers never make the same id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from stockade.core.errors import InvalidArgument, StockadeError

__all__ = ["Layout", "IdParts", "ClockBehind", "DEFAULT_EPOCH_MS"]

#: 2026-01-01T00:00:00Z in Unix milliseconds: the default custom epoch.
DEFAULT_EPOCH_MS = 1_767_225_600_000
ID_BITS_MAX = 63
TIME_UNIT_MS_MAX = 60_000


def _int_in(field: str, value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgument(field, f"must be an int in {low}..{high}, got {value!r}")
    return value


class IdParts(NamedTuple):
    """The three fields of an id (`Layout.decompose`); unpacks as a tuple."""

    timestamp: int  #: time units since the layout's epoch_ms
    worker: int  #: the worker number whose lease issued the id
    sequence: int  #: the id's place within its timestamp step


@dataclass(frozen=True, slots=True)
class Layout:
    """How an id's 63 bits are split, and what its timestamp counts.

    Attributes:
        epoch_ms: the custom epoch, Unix milliseconds; timestamps count from it.
        time_unit_ms: what one timestamp step is, 1..60_000 ms.
        timestamp_bits, worker_bits, sequence_bits: the three fields, most
            significant first; together at most 63 bits, so every id is a
            positive signed 64-bit integer.
    """

    epoch_ms: int = DEFAULT_EPOCH_MS
    time_unit_ms: int = 1
    timestamp_bits: int = 41
    worker_bits: int = 10
    sequence_bits: int = 12

    def __post_init__(self) -> None:
        _int_in("epoch_ms", self.epoch_ms, 0, 2**53)
        _int_in("time_unit_ms", self.time_unit_ms, 1, TIME_UNIT_MS_MAX)
        _int_in("timestamp_bits", self.timestamp_bits, 16, 62)
        _int_in("worker_bits", self.worker_bits, 1, 20)
        _int_in("sequence_bits", self.sequence_bits, 1, 30)
        total = self.timestamp_bits + self.worker_bits + self.sequence_bits
        if total > ID_BITS_MAX:
            raise InvalidArgument(
                "layout", f"timestamp_bits + worker_bits + sequence_bits = {total}, more than {ID_BITS_MAX}"
            )

    @property
    def workers(self) -> int:
        """How many worker numbers there are (0 .. workers - 1)."""
        return 1 << self.worker_bits

    @property
    def sequence_max(self) -> int:
        """The last sequence number of one timestamp step."""
        return (1 << self.sequence_bits) - 1

    @property
    def timestamp_max(self) -> int:
        return (1 << self.timestamp_bits) - 1

    @property
    def timestamp_shift(self) -> int:
        return self.worker_bits + self.sequence_bits

    def timestamp_at(self, unix_ns: int) -> int:
        """The timestamp field for a wall-clock time in Unix nanoseconds (may be negative or too big)."""
        return (unix_ns // 1_000_000 - self.epoch_ms) // self.time_unit_ms

    def unix_ms(self, timestamp: int) -> int:
        """The Unix milliseconds at which a timestamp step begins."""
        return self.epoch_ms + timestamp * self.time_unit_ms

    def compose(self, timestamp: int, worker: int, sequence: int) -> int:
        """The id of (timestamp, worker, sequence); each must fit its field."""
        _int_in("timestamp", timestamp, 0, self.timestamp_max)
        _int_in("worker", worker, 0, self.workers - 1)
        _int_in("sequence", sequence, 0, self.sequence_max)
        return (timestamp << self.timestamp_shift) | (worker << self.sequence_bits) | sequence

    def decompose(self, id_: int) -> IdParts:
        """The (timestamp, worker, sequence) fields of an id of this layout."""
        _int_in("id", id_, 0, 2**ID_BITS_MAX - 1)
        return IdParts(
            id_ >> self.timestamp_shift,
            (id_ >> self.sequence_bits) & (self.workers - 1),
            id_ & self.sequence_max,
        )

    def fingerprint(self) -> str:
        """A short text naming the layout, recorded beside a worker number's reservation."""
        return f"e{self.epoch_ms}u{self.time_unit_ms}t{self.timestamp_bits}w{self.worker_bits}s{self.sequence_bits}"


class ClockBehind(StockadeError):
    """The wall clock is behind the last timestamp this worker number may have used.

    Either this generator's clock went backwards, or the previous holder of the
    worker number used timestamps up to ``floor`` (its reservation, or the
    handoff bound). The generator waited as long as it was allowed (``0`` when
    ``on_clock_behind="refuse"``) and issued nothing.

    Attributes:
        behind_ms: how far the clock is behind, in milliseconds.
        waited_ms: how long the generator waited before giving up.
    """

    code = "clock-behind"

    def __init__(self, behind_ms: int, waited_ms: int) -> None:
        self.behind_ms = behind_ms
        self.waited_ms = waited_ms
        super().__init__(f"the wall clock is {behind_ms} ms behind the last usable timestamp (waited {waited_ms} ms)")
