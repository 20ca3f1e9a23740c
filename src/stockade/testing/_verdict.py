"""What every checker returns: `Violation` and `CheckResult` (no bare bools)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stockade.testing.history import Op

__all__ = ["Violation", "CheckResult", "violation"]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken property.

    Attributes:
        property: ``"P1"`` … ``"P8"`` (or ``"linearizability"``).
        message: what is wrong, in words.
        ops: narrations of the offending operations (with history indices ``[#n]``).
        indices: history indices of the offending records, for tooling.
    """

    property: str
    message: str
    ops: tuple[str, ...] = ()
    indices: tuple[int, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.property}: {self.message}"]
        lines += [f"    {op}" for op in self.ops]
        return "\n".join(lines)


@dataclass
class CheckResult:
    """The verdict over one history: violations (empty means all held) and figures."""

    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_property(self) -> Counter[str]:
        return Counter(v.property for v in self.violations)

    def __str__(self) -> str:
        if self.ok:
            return "no violations"
        return "\n".join(str(v) for v in self.violations)


def violation(prop: str, message: str, ops: Iterable[Op | None] = (), extra: Iterable[str] = ()) -> Violation:
    real = [op for op in ops if op is not None]
    return Violation(
        prop,
        message,
        tuple(op.describe() for op in real) + tuple(extra),
        tuple(op.invoke_index for op in real),
    )
