"""Deliberately broken fenced stores: the controls that every fence test must catch.

Each breaks one rule, and each works over the ports of
`stockade.resources.port`, so it applies to every adapter (SQLite, memory, and
those to come), not only to the one it was first written for:

- ``fencing-off`` (`fencing_off`): swaps the adapter's ``fence_rule`` for one
  that accepts every token, of any value, scope or cluster (the mark only ever
  goes up).
- ``strict-greater`` (`strict_greater`): swaps in ``>`` for ``>=``: rejects a
  holder's second write under the same token (false rejections, S19).
- ``check-then-write`` (`CheckThenWrite`): wraps the adapter; reads the mark
  through the port and judges it, then writes in a separate atomic unit that
  trusts the earlier check (R1/R6 atomicity broken, S04/S20).
  ``between_check_and_write`` is called in the gap, so a test can make the
  race happen every time.

`FencingOffStore`, `StrictGreaterStore` and `CheckThenWriteStore` are the same
controls bound to `SQLiteStore`, constructed like it. `MUTANTS` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from stockade.core.fence import Accept, FenceDecision, FenceRule, Reject, decide
from stockade.core.limits import validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, Write, WriteResult
from stockade.resources._inputs import coerce_token, make_write
from stockade.resources._observe import reject
from stockade.resources._tx import Tx
from stockade.resources.port import FenceAdapterPort
from stockade.resources.sqlite_store import SQLiteStore

__all__ = [
    "accept_everything",
    "reject_equal",
    "fencing_off",
    "strict_greater",
    "CheckThenWrite",
    "FencingOffStore",
    "StrictGreaterStore",
    "CheckThenWriteStore",
    "Mutant",
    "MUTANTS",
]

AdapterT = TypeVar("AdapterT", bound=FenceAdapterPort)


# -- broken rules: swapped into any adapter's fence_rule -----------------------------------


def accept_everything(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
    """No fence: accept any token (the mark still never goes down, so the store's R4 guard stays quiet)."""
    return Accept(max(token.value, high_water))


def reject_equal(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
    """``>`` for ``>=``: a second write under the same token is refused."""
    decision = decide(token, cluster=cluster, scope=scope, high_water=high_water)
    if isinstance(decision, Accept) and token.value == high_water:
        return Reject("stale", high_water)
    return decision


def fencing_off(adapter: AdapterT) -> AdapterT:
    """Break ``adapter`` in place: it accepts every token. Returns it."""
    adapter.fence_rule = accept_everything
    return adapter


def strict_greater(adapter: AdapterT) -> AdapterT:
    """Break ``adapter`` in place: it rejects equal tokens. Returns it."""
    adapter.fence_rule = reject_equal
    return adapter


# -- check-then-write: a wrapper over the fence-adapter port ----------------------------------


def _trusting(checked: Accept) -> FenceRule:
    """A rule that believes an earlier check instead of comparing with the mark now: the bug's second half."""

    def trust(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
        return Accept(max(high_water, checked.new_high_water))

    return trust


class _EachStepAlone:
    """A `FencedUnit` whose every step is an atomic unit of its own (a transaction that is not one)."""

    def __init__(self, adapter: FenceAdapterPort, token: FencingToken, scope: str, checked: Accept) -> None:
        self.scope = scope
        self.high_water = checked.new_high_water
        self._adapter = adapter
        self._token = token
        self._rule = _trusting(checked)

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        with self._adapter.admitted(self._token, self.scope, rule=self._rule) as unit:
            return unit.apply(write, token_value=token_value)

    def get(self, key: str) -> Item | None:
        with self._adapter.admitted(self._token, self.scope, rule=self._rule) as unit:
            return unit.get(key)


class CheckThenWrite:
    """Wraps a store that is a `FenceAdapterPort`: checks the mark in one step, writes in another.

    Every other attribute (``get``, ``list``, ``audit``, ``close``, ...) is the
    wrapped store's.

    Attributes:
        between_check_and_write: called with ``(scope, token)`` after the check
            and before the write begins (None: no pause). Tests use it to let a
            higher token's write land in the gap.
    """

    between_check_and_write: Callable[[str, FencingToken], None] | None = None

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter  # a FenceAdapterPort that is also a store (Any: the rest is delegated)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)

    def __enter__(self) -> CheckThenWrite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.adapter.close()

    def _check(self, scope: str, token: FencingToken, key: str | None) -> Accept:
        port: FenceAdapterPort = self.adapter
        high_water = port.high_water(scope)  # read through the port, in a unit of its own: the bug
        decision = port.fence_rule(token, cluster=port.cluster_id, scope=scope, high_water=high_water)
        if isinstance(decision, Reject):
            reject(decision, resource=port.resource, cluster=port.cluster_id, token=token, scope=scope, key=key)
        assert isinstance(decision, Accept)
        if self.between_check_and_write is not None:
            self.between_check_and_write(scope, token)
        return decision

    def _write(self, write: Write, token: FencingToken) -> WriteResult:
        checked = self._check(write.scope, token, write.key)
        return self.adapter.write_once(write, token, rule=_trusting(checked))

    def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        write = make_write(scope, key, "put", value, idempotency_key, value_bytes_max=self.adapter.value_bytes_max)
        return self._write(write, coerce_token(token))

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        write = make_write(scope, key, "delete", b"", idempotency_key, value_bytes_max=self.adapter.value_bytes_max)
        return self._write(write, coerce_token(token))

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        checked = self._check(scope, fencing_token, None)
        tx = Tx(_EachStepAlone(self.adapter, fencing_token, scope, checked), fencing_token,
                value_bytes_max=self.adapter.value_bytes_max)
        try:
            yield tx
        finally:
            tx.close()


# -- the same controls bound to SQLiteStore (constructed like it) -------------------------------


class FencingOffStore(SQLiteStore):
    """`SQLiteStore` with `accept_everything` as its rule (the ``fencing-off`` control)."""

    fence_rule = staticmethod(accept_everything)


class StrictGreaterStore(SQLiteStore):
    """`SQLiteStore` with `reject_equal` as its rule (the ``strict-greater`` control)."""

    fence_rule = staticmethod(reject_equal)


class CheckThenWriteStore(CheckThenWrite):
    """`CheckThenWrite` over a `SQLiteStore` opened with the same arguments."""

    def __init__(self, path: Any, **options: Any) -> None:
        super().__init__(SQLiteStore(path, **options))


@dataclass(frozen=True, slots=True)
class Mutant:
    """One control.

    Attributes:
        description: what it breaks.
        port: the port it works over.
        wrap: makes the control from a store that is a `FenceAdapterPort`.
        sqlite_class: the control bound to `SQLiteStore`, constructed like it.
    """

    description: str
    port: str
    wrap: Callable[[Any], Any]
    sqlite_class: type


MUTANTS: dict[str, Mutant] = {
    "fencing-off": Mutant("accepts every token (no fence)", "FenceAdapterPort.fence_rule", fencing_off,
                          FencingOffStore),
    "strict-greater": Mutant("'>' for '>=': rejects a holder's second write under one token",
                             "FenceAdapterPort.fence_rule", strict_greater, StrictGreaterStore),
    "check-then-write": Mutant("checks the mark in one atomic unit, writes in another",
                               "FenceAdapterPort", CheckThenWrite, CheckThenWriteStore),
}
