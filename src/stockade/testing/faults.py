"""Fault-injecting wrappers over the ports: the seam of the fault kit.

A wrapper takes a real implementation of a port and makes it fail the way
real backends fail, chosen by a seeded `random.Random` so a failing run
replays. Because they wrap the port, not a backend, they work on every
backend: the SQLite file, memory, and whatever is registered next.

- `FaultyRecords` wraps a `stockade.core.engine.RecordStore`: a write unit
  fails before it commits (nothing happened, ``certain_no_effect``), or
  commits and then fails (the caller never hears of a change that is durable:
  the lost reply that C1 must count as "handed out").
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from stockade.core.engine import RecordStore, RecordTx
from stockade.core.errors import BackendUnavailable

__all__ = ["FaultPlan", "FaultyRecords"]


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """How often a write unit fails, each in 0.0..1.0.

    Attributes:
        fail_before_commit: the unit is discarded and the caller gets
            `BackendUnavailable` with ``certain_no_effect=True``.
        fail_after_commit: the unit commits, and the caller gets
            `BackendUnavailable` (outcome unknown) instead of the answer.
    """

    fail_before_commit: float = 0.0
    fail_after_commit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fail_before_commit", "fail_after_commit"):
            value = getattr(self, name)
            if not isinstance(value, float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a float in 0.0..1.0, got {value!r}")


class FaultyRecords:
    """A record store that fails some write units, as planned, by seed.

    Attributes:
        failed_before, failed_after: how many units failed each way so far.
    """

    def __init__(self, inner: RecordStore, plan: FaultPlan, rng: random.Random) -> None:
        self.inner = inner
        self.plan = plan
        self.rng = rng
        self.failed_before = 0
        self.failed_after = 0

    @contextmanager
    def write(self) -> Iterator[RecordTx]:
        before = self.rng.random() < self.plan.fail_before_commit
        after = not before and self.rng.random() < self.plan.fail_after_commit
        with self.inner.write() as tx:
            yield tx
            if before:
                self.failed_before += 1
                raise BackendUnavailable("injected: the unit failed before its commit", certain_no_effect=True)
        if after:
            self.failed_after += 1
            raise BackendUnavailable("injected: the unit committed, and its answer was lost")

    def read(self) -> AbstractContextManager[RecordTx]:
        return self.inner.read()

    def close(self) -> None:
        self.inner.close()
