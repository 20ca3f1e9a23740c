"""The fence rule (R1, R2): the one comparison every resource makes.

A resource that keeps a high-water mark (HWM) per scope calls `decide` inside
the same transaction that applies the write, and applies the write only on
`Accept`. The rule itself has no I/O: the atomicity is the adapter's job.

    token for another cluster or scope   -> Reject("wrong-cluster" | "wrong-scope")
    token.value <  HWM                   -> Reject("stale")
    token.value >= HWM                   -> Accept(new_high_water=token.value)

Equal tokens are accepted: one lease may write many times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stockade.core.errors import StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken

__all__ = ["Accept", "Reject", "FenceDecision", "decide", "raise_for"]

RejectReason = Literal["stale", "wrong-scope", "wrong-cluster"]


@dataclass(frozen=True, slots=True)
class Accept:
    """Apply the write and store ``new_high_water`` in the same transaction."""

    new_high_water: int


@dataclass(frozen=True, slots=True)
class Reject:
    """Apply nothing. ``high_water`` is the unchanged mark."""

    reason: RejectReason
    high_water: int


FenceDecision = Accept | Reject


def decide(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
    """Judge a write carrying ``token`` against a scope's high-water mark.

    Args:
        token: the token the writer carries.
        cluster: the coordinator cluster this resource trusts.
        scope: the scope being written.
        high_water: the scope's current HWM (0 if never written).

    Returns:
        `Accept` or `Reject`; never raises for a well-formed token.
    """
    if token.cluster != cluster:
        return Reject("wrong-cluster", high_water)
    if token.scope != scope:
        return Reject("wrong-scope", high_water)
    if token.value < high_water:
        return Reject("stale", high_water)
    return Accept(token.value)


def raise_for(token: FencingToken, decision: Reject, *, cluster: str, scope: str) -> None:
    """Raise the typed exception for a rejection (the adapters' one mapping)."""
    if decision.reason == "stale":
        raise StaleToken(token, decision.high_water)
    expected = cluster if decision.reason == "wrong-cluster" else scope
    raise TokenMismatch(token, decision.reason, expected)
