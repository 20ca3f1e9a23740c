"""The adapters' one admission step: judge a write by the core's rule and, if it is refused, make that observable.

Every adapter keeps its mark its own way (a row, a file, a hash field, a dict) and reads it inside its
atomic unit; what it does with the mark is the same everywhere, so it is written once here:

    mark = effective_mark(own, default_floor)            # R4: a floor covers the scope
    new_mark = admit_mark(token, scope=..., cluster=..., high_water=mark, resource=..., rule=..., forged=...)
    # ... apply the writes and set the mark to new_mark, in the same unit

`admit` is the same step with an idempotency record (R3): it answers `Replay` when the key was applied.
A refusal goes through `stockade.resources._observe.reject` (counted, logged, raised as its typed error),
so no adapter can forget one half of R5.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, Protocol

from stockade.core.errors import invariant
from stockade.core.fence import Accept, FenceRule, Recorded, Reject, Replay, check_write, decide
from stockade.core.tokens import FencingToken
from stockade.resources._observe import reject

__all__ = ["effective_mark", "admit", "admit_mark", "Refusal"]


class Refusal(Protocol):
    """How a refusal is made observable and raised: `stockade.resources._observe.reject`'s signature."""

    def __call__(self, decision: Reject, *, resource: str, cluster: str, token: FencingToken, scope: str,
                 key: str | None) -> NoReturn: ...


def effective_mark(own: int | None, default_floor: int | None) -> int:
    """A scope's mark as the fence judges it: its own (None: never written), raised to the default floor (R4)."""
    return max(own or 0, default_floor or 0)


def admit(
    token: FencingToken,
    *,
    scope: str,
    cluster: str,
    high_water: int,
    resource: str | Callable[[], str],
    rule: FenceRule = decide,
    forged: str | None = None,
    fingerprint: str | None = None,
    recorded: Recorded | None = None,
    key: str | None = None,
    refuse: Refusal = reject,
) -> Accept | Replay:
    """Judge one write (`stockade.core.fence.check_write`: R2 -> R3 -> R1) and refuse it observably.

    Args:
        token: the writer's token.
        scope: the scope written.
        cluster: the cluster the resource trusts.
        high_water: the scope's mark, read in the unit that will apply the write (`effective_mark`).
        resource: the adapter's name for itself, or a function naming it (called only on a refusal).
        rule: the comparison (`decide`; a control swaps it).
        forged: why the token's verification failed (None: it passed).
        fingerprint, recorded: the write's idempotency fingerprint and what the resource recorded under
            its key (None without one).
        key: the key written, for the log (None for a unit's admission).
        refuse: what makes a refusal observable and raises it (`reject`; the sqlite store's also notes
            it in its journal).

    Returns:
        `Accept` (apply, and set the mark to ``new_high_water``) or `Replay` (answer the recorded result).

    Raises:
        StaleToken, TokenMismatch, InvalidArgument: refused (R5: counted and logged first).
    """
    decision = check_write(token, scope=scope, cluster=cluster, high_water=high_water, fingerprint=fingerprint,
                           recorded=recorded, rule=rule, forged=forged)
    if isinstance(decision, Reject):
        refuse(decision, resource=resource if isinstance(resource, str) else resource(), cluster=cluster,
               token=token, scope=scope, key=key)
    invariant(isinstance(decision, (Accept, Replay)), "fence decision is neither Accept, Replay nor Reject")
    return decision


def admit_mark(
    token: FencingToken,
    *,
    scope: str,
    cluster: str,
    high_water: int,
    resource: str | Callable[[], str],
    rule: FenceRule = decide,
    forged: str | None = None,
    key: str | None = None,
    refuse: Refusal = reject,
) -> int:
    """`admit` without an idempotency key: the mark the accepted write sets (never lower than ``high_water``).

    Raises:
        StaleToken, TokenMismatch, InvalidArgument: refused (R5: counted and logged first).
    """
    decision = admit(token, scope=scope, cluster=cluster, high_water=high_water, resource=resource, rule=rule,
                     forged=forged, key=key, refuse=refuse)
    invariant(isinstance(decision, Accept), "a write without an idempotency key was answered as a replay")
    assert isinstance(decision, Accept)  # for the type checker; invariant() above is the real check
    return decision.new_high_water
