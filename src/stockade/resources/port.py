"""The typed seams of a fenced resource.

Two ports, so that a new adapter (PostgreSQL, a user's SQLite file, Redis,
files) is one module that fills them in, one line in `registry`, and one
parameter of the conformance suite (``stockade.testing.conformance``):

- `FencedStorePort`: what the client's store handle calls (``put``,
  ``delete``, ``get``, ``list``, ``high_water``, ``cluster_id``, ``close``).
  `TransactionalStorePort` adds the multi-step transaction (R6) and the audit
  trail that the conformance suite and the checkers read.
- `FenceAdapterPort`: what every enforcing adapter offers underneath: admit a
  token and apply the caller's writes in the resource's own atomic unit
  (`write_once` for one write with R3, `admitted` for many), read a scope's
  mark, raise marks to a floor (R4). The check order itself is not the
  adapter's: it calls `stockade.core.fence.check_write` and, on a rejection,
  `stockade.resources._observe.reject`.

The ports are structural (`typing.Protocol`): an adapter does not inherit from
them, it matches them, and the conformance suite proves that it behaves.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from stockade.core.fence import FenceRule
from stockade.core.limits import LIST_PAGE_MAX
from stockade.core.tokens import FencingToken
from stockade.core.values import AuditRecord, FenceFloors, Item, Write, WriteResult

__all__ = ["FencedStorePort", "TransactionPort", "TransactionalStorePort", "FencedUnit", "FenceAdapterPort"]


@runtime_checkable
class FencedStorePort(Protocol):
    """A fenced key-value store, as the client's store handle sees it.

    Every write is judged R2 -> R3 -> R1 and applied atomically with its
    check; a rejected write changes nothing, is logged and counted (R5), and
    raises `StaleToken` or `TokenMismatch`. Bad input raises `InvalidArgument`
    and changes nothing.
    """

    @property
    def cluster_id(self) -> str:
        """The coordinator cluster whose tokens this store trusts (R2)."""
        ...

    def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken | str,
        idempotency_key: str | None = None,
    ) -> WriteResult: ...

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult: ...

    def get(self, scope: str, key: str) -> Item | None: ...

    def list(self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX) -> builtins.list[Item]: ...

    def high_water(self, scope: str) -> int: ...

    def close(self) -> None: ...


class TransactionPort(Protocol):
    """The steps of one multi-step transaction: one scope, one token, already fenced (R6)."""

    scope: str
    token: FencingToken
    high_water: int

    def put(self, key: str, value: bytes | str) -> WriteResult: ...

    def delete(self, key: str) -> WriteResult: ...

    def get(self, key: str) -> Item | None: ...


class TransactionalStorePort(FencedStorePort, Protocol):
    """A `FencedStorePort` with multi-step transactions and an audit trail.

    Attributes:
        value_bytes_max: the largest value the store takes (the client checks it before it sends).
    """

    value_bytes_max: int

    def transaction(self, scope: str, *, token: FencingToken | str) -> AbstractContextManager[TransactionPort]:
        """Fence once, then hold the resource's atomic unit until the block ends (R6)."""
        ...

    def high_waters(self) -> dict[str, int]: ...

    def audit(
        self, scope: str | None = None, *, after_seq: int = 0, limit: int = LIST_PAGE_MAX
    ) -> builtins.list[AuditRecord]: ...

    def commit_seq(self) -> int: ...


class FencedUnit(Protocol):
    """The resource's atomic unit after a token was admitted for ``scope``.

    Steps are visible to later steps and become durable together when the
    unit ends normally; an exception ends it with nothing applied.
    """

    @property
    def scope(self) -> str: ...

    @property
    def high_water(self) -> int: ...

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        """Apply one validated write of this scope (data, audit record, idempotency record)."""
        ...

    def get(self, key: str) -> Item | None:
        """Read ``key`` as this unit sees it (its own steps included)."""
        ...


class FenceAdapterPort(Protocol):
    """What every enforcing adapter offers, whatever its resource.

    Attributes:
        fence_rule: the comparison the adapter passes to
            `stockade.core.fence.check_write`; `stockade.core.fence.decide`
            unless a control in ``stockade.testing.mutants`` swapped it.
    """

    fence_rule: FenceRule

    @property
    def cluster_id(self) -> str: ...

    @property
    def resource(self) -> str:
        """The adapter's name for its resource, as logged with a rejection."""
        ...

    @property
    def value_bytes_max(self) -> int: ...

    def write_once(self, write: Write, token: FencingToken, *, rule: FenceRule | None = None) -> WriteResult:
        """Judge ``write`` (R2 -> R3 -> R1) and apply it in one atomic unit.

        Args:
            write: a validated write.
            token: a validated token.
            rule: judge with this instead of ``fence_rule`` (a control's seam).

        Raises:
            StaleToken, TokenMismatch: rejected (logged and counted). Nothing changed.
            InvalidArgument: the idempotency key was used for another operation.
            LimitExceeded: the resource's scope bound was reached.
            BackendUnavailable: the resource failed or stayed busy.
        """
        ...

    def admitted(
        self, token: FencingToken, scope: str, *, rule: FenceRule | None = None
    ) -> AbstractContextManager[FencedUnit]:
        """Open the atomic unit, admit ``token`` for ``scope`` (R2, R1) and yield it for the caller's writes.

        A higher token's write waits until the unit ends (R6).

        Raises:
            As `write_once`, when the unit opens.
        """
        ...

    def high_water(self, scope: str) -> int:
        """The scope's mark (0 if never written)."""
        ...

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise each scope's mark to at least its floor, atomically; never lower one (R4).

        ``default`` (and a `FenceFloors`' own default) is the floor of every
        scope not named, including scopes the resource never saw: kept durably,
        and every scope's mark is at least it.

        Returns:
            The marks of the named scopes afterwards.

        Raises:
            InvalidArgument: a bad scope or floor. Nothing changed.
            LimitExceeded: the resource's scope bound would be passed. Nothing changed.
        """
        ...
