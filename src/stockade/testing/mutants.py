"""Deliberately broken fenced stores: the controls that every fence test must catch.

Each is a `SQLiteStore` with one rule broken, as small as possible so the
difference from the real store is obvious:

- `FencingOffStore`: never rejects (no fence at all).
- `StrictGreaterStore`: ``>`` for ``>=`` — rejects a holder's second write
  under the same token (false rejections, S19).
- `CheckThenWriteStore`: checks the HWM in one transaction and writes in
  another (R1/R6 atomicity broken, S04/S20). ``between_check_and_write`` is
  called in the gap, so a test can make the race happen every time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stockade.core.fence import Accept, FenceDecision, Reject
from stockade.core.limits import validate_scope
from stockade.core.tokens import FencingToken
from stockade.resources.store import SQLiteStore, Tx, WriteResult, _Write, coerce_token

__all__ = ["FencingOffStore", "StrictGreaterStore", "CheckThenWriteStore", "MUTANTS"]


class FencingOffStore(SQLiteStore):
    """Accepts every token, of any value, scope or cluster (the mark only ever goes up)."""

    def _decide(self, token: FencingToken, scope: str, high_water: int) -> FenceDecision:
        return Accept(max(token.value, high_water))


class StrictGreaterStore(SQLiteStore):
    """Accepts only ``token > HWM``: equal tokens (one lease, many writes) are rejected."""

    def _decide(self, token: FencingToken, scope: str, high_water: int) -> FenceDecision:
        decision = super()._decide(token, scope, high_water)
        if isinstance(decision, Accept) and token.value == high_water:
            return Reject("stale", high_water)
        return decision


class CheckThenWriteStore(SQLiteStore):
    """Reads and judges the HWM in one transaction, then writes in a separate one.

    Attributes:
        between_check_and_write: called with ``(scope, token)`` after the check
            committed and before the write begins (None: no pause). Tests use it
            to let a higher token's write land in the gap.
    """

    between_check_and_write: Callable[[str, FencingToken], None] | None = None

    def _check(self, scope: str, token: FencingToken, key: str | None) -> int:
        with self._write() as conn:
            old = self._high_water(conn, scope)
            decision = self._decide(token, scope, old or 0)
            if isinstance(decision, Reject):
                self._reject(token, decision, scope, key)
            return decision.new_high_water
        # the transaction ends here: the bug

    @staticmethod
    def _set_high_water_blindly(conn: sqlite3.Connection, scope: str, high_water: int) -> None:
        # The check was "done" in the other transaction, so just store the mark: the bug's second half.
        conn.execute(
            "INSERT INTO hwm (scope, high_water) VALUES (?, ?) "
            "ON CONFLICT (scope) DO UPDATE SET high_water = excluded.high_water",
            (scope, high_water),
        )

    def _write_unchecked(self, write: _Write, token: FencingToken, high_water: int) -> WriteResult:
        with self._write() as conn:
            self._set_high_water_blindly(conn, write.scope, high_water)
            return self._apply(conn, write, token.value, high_water)

    def _pause(self, scope: str, token: FencingToken) -> None:
        if self.between_check_and_write is not None:
            self.between_check_and_write(scope, token)

    def _fenced_write(self, write: _Write, token: FencingToken) -> WriteResult:
        high_water = self._check(write.scope, token, write.key)
        self._pause(write.scope, token)
        return self._write_unchecked(write, token, high_water)

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        high_water = self._check(scope, fencing_token, None)
        self._pause(scope, fencing_token)

        def run_each_step_alone(step: Callable[[sqlite3.Connection], Any]) -> Any:
            with self._write() as conn:
                self._set_high_water_blindly(conn, scope, high_water)
                return step(conn)

        tx = Tx(self, scope, fencing_token, high_water, run=run_each_step_alone)
        try:
            yield tx
        finally:
            tx._closed = True


MUTANTS: dict[str, type[SQLiteStore]] = {
    "fencing-off": FencingOffStore,
    "strict-greater": StrictGreaterStore,
    "check-then-write": CheckThenWriteStore,
}
