"""The fence suite's attack class "partial failure inside a unit", for every adapter that can meet it.

A fenced unit (a transaction, a Redis batch, a directory batch) writes once,
then a later write of the same unit fails: the resource itself refuses it (an
adapter-specific invalid operation: a NOT NULL column, a Redis INCRBY of
``01``, a file name with a slash) or the harness injects a fault after the
first write reached the unit. The unit must then leave nothing behind: the
earlier writes unapplied, the scope's mark unmoved (R1 and R6 say the mark
moves *with* the writes, in one atomic unit), and the failure reported as what
it is, never as a success. Sent again with the same token, and without the
failing write, the unit applies once.

This is an optional capability of a harness (`PartialFailures`): for each of
the two kinds, the adapter lists its ways (`FailingWrite`) or says, in words,
why the kind does not apply to it (`NotApplicable`); a test reports that as a
skip with the reason, never silently. tests/test_fence_conformance.py gives
every target its declaration (a missing one fails) through the
``partial_failures`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from stockade.testing.conformance.fence import FenceHarness, tok, write


@dataclass(frozen=True)
class FailingWrite:
    """One way a later write of a unit fails inside the adapter's atomic unit.

    Attributes:
        name: what fails (for the report).
        add: ``(harness, unit, key)``: called inside an open unit right after
            it wrote ``key``; adds the failing write. It raises at once (a SQL
            statement runs now) or the unit raises when it ends (Redis, files).
        raises: the exception types the failure surfaces as.
        prepare: ``(harness, scope, key)``, run before the unit opens (and
            before the state it must keep is read): data the failure needs.
    """

    name: str
    add: Callable[[Any, Any, str], None]
    raises: tuple[type[BaseException], ...]
    prepare: Callable[[Any, str, str], None] | None = None


@dataclass(frozen=True)
class NotApplicable:
    """Why a kind of partial failure does not apply to an adapter (shown as the skip reason)."""

    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError("say why the kind does not apply")


Ways = tuple[FailingWrite, ...] | NotApplicable


@dataclass(frozen=True)
class PartialFailures:
    """An adapter's declaration, for both kinds.

    Attributes:
        refused: later writes the resource itself refuses.
        injected: faults the harness injects after the unit's first write reached the resource.
    """

    refused: Ways
    injected: Ways

    def __post_init__(self) -> None:
        for ways in (self.refused, self.injected):
            if not isinstance(ways, NotApplicable) and not ways:
                raise ValueError("list at least one way, or declare the kind NotApplicable")


def _half_applied(fence: FenceHarness, ways: Ways) -> tuple[int, int]:
    """(units that left something behind or did not raise their declared error, units run) over ``ways``."""
    if isinstance(ways, NotApplicable):
        pytest.skip(f"declared not applicable: {ways.reason}")
    bad = 0
    for n, way in enumerate(ways):
        key = f"p{n}"
        write(fence, tok(2 * n + 1), k=str(n).encode())  # the mark at 2n+1
        if way.prepare is not None:
            way.prepare(fence, "a", key)
        before = fence.state()
        try:
            with fence.fenced("a", tok(2 * n + 2)) as unit:
                unit.write(key, b"first")
                way.add(fence, unit, key)
                unit.write(f"{key}-after", b"after")
        except Exception as error:  # noqa: BLE001 - judged below: the declared error, and nothing applied
            reported = isinstance(error, way.raises)
        else:
            reported = False  # a success
        if not reported or fence.state() != before or fence.high_water("a") != 2 * n + 1:
            bad += 1
            continue
        with fence.fenced("a", tok(2 * n + 2)) as unit:  # sent again without the failing write: once
            unit.write(key, b"first")
        assert fence.read("a", key) == b"first" and fence.high_water("a") == 2 * n + 2, way.name
    return bad, len(ways)


def test_a_unit_whose_later_write_the_resource_refuses_applies_nothing(
    fence: FenceHarness, partial_failures: PartialFailures
) -> None:
    bad, units = _half_applied(fence, partial_failures.refused)
    assert bad == 0, f"{bad} of {units} units half-applied or not reported"


def test_a_unit_with_a_fault_after_its_first_write_applies_nothing(
    fence: FenceHarness, partial_failures: PartialFailures
) -> None:
    bad, units = _half_applied(fence, partial_failures.injected)
    assert bad == 0, f"{bad} of {units} units half-applied or not reported"


__all__ = ["FailingWrite", "NotApplicable", "PartialFailures", "Ways"] + [
    name for name in dir() if name.startswith("test_")
]
