"""The fence rule (R1, R2) and the order of a write's checks (R2 -> R3 -> R1).

A resource that keeps a high-water mark (HWM) per scope calls `check_write`
(or, with no idempotency key in play, `decide`) inside the same transaction
that applies the write, and applies the write only on `Accept`. The rule
itself has no I/O: the atomicity is the adapter's job.

`decide`, the comparison:

    token for another cluster or scope   -> Reject("wrong-cluster" | "wrong-scope")
    token.value <  HWM                   -> Reject("stale")
    token.value >= HWM                   -> Accept(new_high_water=token.value)

Equal tokens are accepted: one lease may write many times.

`check_write`, the order every adapter follows for one write:

    0. token not verified by the resource's keys       -> Reject("forged") (P3; nothing else is looked at)
    1. token for another cluster or scope             -> Reject (R2; nothing else is looked at)
    2. idempotency key recorded, same operation       -> Replay(original result) (R3, even if stale)
       idempotency key recorded, another operation    -> raise InvalidArgument
    3. token.value <  HWM                             -> Reject("stale") (R1)
    4. otherwise                                      -> Accept(new_high_water=token.value)

Step 0 is the adapter's: it verifies the token's MAC with its keyring
(`stockade.core.signing`; and, where the coordinator lives with it, that the
value was issued) and passes why it failed as ``forged``. Provenance comes first
so that a token of another cluster or scope learns
nothing, not even an earlier result; staleness comes after the replay so that
a retry of an acknowledged write still gets its answer after a newer holder
wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from stockade.core.errors import InvalidArgument, StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.core.values import WriteResult

__all__ = [
    "Accept",
    "Reject",
    "Replay",
    "Recorded",
    "FenceDecision",
    "WriteDecision",
    "FenceRule",
    "decide",
    "check_write",
    "raise_for",
]

RejectReason = Literal["stale", "wrong-scope", "wrong-cluster", "forged"]


@dataclass(frozen=True, slots=True)
class Accept:
    """Apply the write and store ``new_high_water`` in the same transaction."""

    new_high_water: int


@dataclass(frozen=True, slots=True)
class Reject:
    """Apply nothing. ``high_water`` is the unchanged mark."""

    reason: RejectReason
    high_water: int
    #: For ``forged``: why verification failed (`stockade.core.signing.FORGED_DETAILS`).
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Replay:
    """Apply nothing and answer ``result``: the idempotency key was already applied (R3)."""

    result: WriteResult


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a resource remembers under one (scope, idempotency key).

    Attributes:
        fingerprint: `stockade.core.values.Write.fingerprint` of the write applied then.
        result: that write's result, as it is to be replayed (``replayed=True``).
    """

    fingerprint: str
    result: WriteResult


FenceDecision = Accept | Reject
WriteDecision = Replay | Accept | Reject


class FenceRule(Protocol):
    """The signature of `decide`: what an adapter calls to compare a token with a mark.

    Adapters hold their rule as an attribute so that the controls in
    ``stockade.testing.mutants`` can swap in a broken one.
    """

    def __call__(self, token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision: ...


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


def check_write(
    token: FencingToken,
    *,
    scope: str,
    cluster: str,
    high_water: int,
    fingerprint: str | None,
    recorded: Recorded | None,
    rule: FenceRule = decide,
    forged: str | None = None,
) -> WriteDecision:
    """Judge one write in the order R2 -> R3 -> R1 (the table in this module's docstring).

    The adapter reads the scope's mark and the record of the write's
    idempotency key (None without a key, or when none is kept) in its atomic
    unit, calls this, and in the same unit applies the write only on `Accept`.

    Args:
        token: the token the writer carries.
        scope: the scope being written.
        cluster: the coordinator cluster this resource trusts.
        high_water: the scope's current HWM (0 if never written).
        fingerprint: the write's fingerprint (None without an idempotency key).
        recorded: what the resource remembers under the write's idempotency key.
        rule: the comparison; `decide` unless a control swaps it.
        forged: why the adapter's verification of the token failed (None: it
            passed, or the adapter checks no keys). Refused before anything else.

    Returns:
        `Replay`, `Reject` or `Accept`.

    Raises:
        InvalidArgument: the idempotency key was applied to a different operation.
    """
    if forged is not None:
        return Reject("forged", high_water, forged)
    decision = rule(token, cluster=cluster, scope=scope, high_water=high_water)
    if isinstance(decision, Reject) and decision.reason != "stale":
        return decision
    if recorded is not None:
        if recorded.fingerprint != fingerprint:
            raise InvalidArgument("idempotency_key", "already used in this scope for a different operation")
        return Replay(recorded.result)
    return decision


def raise_for(token: FencingToken, decision: Reject, *, cluster: str, scope: str) -> None:
    """Raise the typed exception for a rejection (the adapters' one mapping)."""
    if decision.reason == "stale":
        raise StaleToken(token, decision.high_water)
    if decision.reason == "forged":
        raise TokenMismatch(token, f"forged ({decision.detail})", "a token this resource's keys verify")
    expected = cluster if decision.reason == "wrong-cluster" else scope
    raise TokenMismatch(token, decision.reason, expected)
