"""A simulated network: drop, delay, duplicate, reorder, partition — all from one `random.Random`.

Messages go from one named process to another. The network decides each
message's fate when it is sent (dropped, or delivered after a delay, maybe
twice), and a partition also drops what is in flight when it reaches the cut
link. Reordering is what independent delays produce; ``slow_probability``
adds the long-tail delays that let an old request overtake a newer one by
seconds (S05, S06).

Two modes:

- automatic (the seeded simulator): each delivery has a due time and the
  scheduler takes the earliest (`next_due_ns`, `pop_due`);
- manual (the hypothesis state machine): messages wait in ``pending`` until a
  test delivers, drops or duplicates one explicitly.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from stockade.core.errors import InvalidArgument

__all__ = ["NetworkOptions", "Message", "SimNetwork"]


@dataclass(frozen=True, slots=True)
class NetworkOptions:
    """Fault knobs; probabilities per message, delays in nanoseconds of true time."""

    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    delay_min_ns: int = 100_000
    delay_max_ns: int = 2_000_000
    slow_probability: float = 0.0
    slow_delay_max_ns: int = 1_000_000_000

    def __post_init__(self) -> None:
        for name in ("drop_probability", "duplicate_probability", "slow_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidArgument(name, f"must be a probability in 0..1, got {value}")
        if not 0 <= self.delay_min_ns <= self.delay_max_ns:
            raise InvalidArgument("delay_max_ns", "need 0 <= delay_min_ns <= delay_max_ns")
        if self.slow_delay_max_ns < self.delay_max_ns:
            raise InvalidArgument("slow_delay_max_ns", "must be at least delay_max_ns")


@dataclass(slots=True)
class Message:
    src: str
    dst: str
    payload: Any
    sent_ns: int
    due_ns: int = 0
    seq: int = 0
    duplicate: bool = False

    def __lt__(self, other: Message) -> bool:
        return (self.due_ns, self.seq) < (other.due_ns, other.seq)


@dataclass
class SimNetwork:
    """The links between processes, with faults drawn from ``rng``.

    Attributes:
        pending: in manual mode, messages waiting for the test to decide.
        cut: directed links ``(src, dst)`` that currently drop everything.
    """

    rng: random.Random
    options: NetworkOptions = field(default_factory=NetworkOptions)
    manual: bool = False
    pending: list[Message] = field(default_factory=list)
    cut: set[tuple[str, str]] = field(default_factory=set)
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    _heap: list[Message] = field(default_factory=list)
    _seq: int = 0

    def _delay(self) -> int:
        o = self.options
        if o.slow_probability and self.rng.random() < o.slow_probability:
            return self.rng.randint(o.delay_max_ns, o.slow_delay_max_ns)
        return self.rng.randint(o.delay_min_ns, o.delay_max_ns)

    def _enqueue(self, message: Message) -> None:
        self._seq += 1
        message.seq = self._seq
        if self.manual:
            self.pending.append(message)
        else:
            heapq.heappush(self._heap, message)

    def send(self, now_ns: int, src: str, dst: str, payload: Any) -> None:
        """Hand a message to the network; it may be lost, late, or arrive twice."""
        self.sent += 1
        if (src, dst) in self.cut:
            self.dropped += 1
            return
        o = self.options
        if self.manual:
            self._enqueue(Message(src, dst, payload, now_ns, now_ns))
            return
        if o.drop_probability and self.rng.random() < o.drop_probability:
            self.dropped += 1
            return
        self._enqueue(Message(src, dst, payload, now_ns, now_ns + self._delay()))
        if o.duplicate_probability and self.rng.random() < o.duplicate_probability:
            self.duplicated += 1
            self._enqueue(Message(src, dst, payload, now_ns, now_ns + self._delay(), duplicate=True))

    def next_due_ns(self) -> int | None:
        return self._heap[0].due_ns if self._heap else None

    def pop_due(self) -> Message | None:
        """The earliest message in flight, or None if it was cut off on the way (or none is left)."""
        if not self._heap:
            return None
        message = heapq.heappop(self._heap)
        if (message.src, message.dst) in self.cut:
            self.dropped += 1
            return None
        return message

    def in_flight(self) -> int:
        return len(self._heap) + len(self.pending)

    # -- partitions --------------------------------------------------------------------------

    def partition(self, side_a: list[str], side_b: list[str], *, one_way: bool = False) -> None:
        """Cut every link from ``side_a`` to ``side_b`` (and back, unless ``one_way``)."""
        for a in side_a:
            for b in side_b:
                self.cut.add((a, b))
                if not one_way:
                    self.cut.add((b, a))

    def heal(self) -> None:
        self.cut.clear()

    # -- manual mode ---------------------------------------------------------------------------

    def take(self, index: int) -> Message:
        """Remove and return a pending message (manual mode) for delivery."""
        return self.pending.pop(index % len(self.pending))

    def drop(self, index: int) -> Message:
        self.dropped += 1
        return self.pending.pop(index % len(self.pending))

    def duplicate(self, index: int) -> None:
        original = self.pending[index % len(self.pending)]
        self.duplicated += 1
        self._enqueue(Message(original.src, original.dst, original.payload, original.sent_ns, original.due_ns,
                              duplicate=True))
