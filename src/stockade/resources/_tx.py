"""The caller's side of a multi-step transaction, the same over every adapter.

An adapter's ``transaction`` admits the token once (R2, R1) in its atomic
unit and hands the caller a `Tx` over that unit: the steps validate their
input here, count against `TX_WRITES_MAX`, and go to the unit, which holds the
resource's atomic unit. Either the unit holds the resource's lock until the
block ends, so a higher token's write waits for the whole transaction, or it
buffers the steps and applies them with a second fence check in one short
commit, so a higher token's write that landed meanwhile aborts the whole
transaction (the SQLite store does this). Both keep R6.
"""

from __future__ import annotations

from stockade.core.errors import InvalidArgument, LimitExceeded
from stockade.core.limits import TX_WRITES_MAX, validate_key, validate_value
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, Write, WriteResult
from stockade.resources.port import FencedUnit

__all__ = ["Tx"]


class Tx:
    """The steps of one transaction: one scope, one token, already fenced.

    Attributes:
        scope: the scope of every step.
        token: the token that passed the fence when the transaction began.
        high_water: the scope's HWM after the fence check (the token's value).
        results: after a commit, the committed `WriteResult` of every step in
            order, for adapters whose steps learn their ``commit_seq`` only then
            (None before).
    """

    def __init__(self, unit: FencedUnit, token: FencingToken, *, value_bytes_max: int) -> None:
        self.scope = unit.scope
        self.token = token
        self.high_water = unit.high_water
        self._unit = unit
        self._value_bytes_max = value_bytes_max
        self._writes = 0
        self._closed = False
        self.results: list[WriteResult] | None = None

    def close(self) -> None:
        """End the steps (the adapter calls this when the block ends); later steps raise."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("transaction", "is closed")

    def _step(self, write: Write) -> WriteResult:
        self._check_open()
        if self._writes >= TX_WRITES_MAX:
            raise LimitExceeded("TX_WRITES_MAX", TX_WRITES_MAX)
        result = self._unit.apply(write, token_value=self.token.value)
        self._writes += 1
        return result

    def put(self, key: str, value: bytes | str) -> WriteResult:
        """Write ``value`` at ``key`` (visible to later steps; durable at commit).

        Raises:
            InvalidArgument: bad key or value, or the transaction is closed. This step changed nothing.
            LimitExceeded: `TX_WRITES_MAX` steps already.
            BackendUnavailable: the step failed in the resource; the transaction will commit nothing.
        """
        write = Write(self.scope, validate_key(key), "put", validate_value(value, self._value_bytes_max), None)
        return self._step(write)

    def delete(self, key: str) -> WriteResult:
        """Remove ``key``. Raises as `put`."""
        return self._step(Write(self.scope, validate_key(key), "delete", b"", None))

    def get(self, key: str) -> Item | None:
        """Read ``key`` as this transaction sees it (its own steps included)."""
        key = validate_key(key)
        self._check_open()
        return self._unit.get(key)
