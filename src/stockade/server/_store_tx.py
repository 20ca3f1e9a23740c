"""The store's side of ``POST /v1/tx/{scope}``: the body's steps, and how they reach the store file.

A transaction is one scope, one token and its steps, in order, applied all or
none (R6) by `SQLiteStore.transaction`: the token is checked, and checked
again in the one short commit that applies every step, so a newer holder's
write that landed in between aborts the whole transaction with `StaleToken`.

Why through the store's writer thread: the event loop never waits on a file
lock (docs/architecture.md). A transaction's commit may wait for another
process that holds the store's write lock (a paused embedded writer, a
backup), so it never runs inline on the loop: `StoreWrites.try_batch` hands
any batch with a transaction to the `GroupCommitter`'s thread, which owns the
file's write connection. Single ``/v1/kv`` writes keep their group commit and
their inline path; a batch that mixes both commits its runs of single writes
with `SQLiteStore.apply_batch` and each transaction on its own, in submission
order, and each failure reaches only the requests it belongs to.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stockade.core.errors import InvalidArgument, LimitExceeded, invariant
from stockade.core.limits import TX_WRITES_MAX, validate_key
from stockade.core.tokens import FencingToken
from stockade.core.values import Op, WriteResult
from stockade.resources.store.sqlite_store import BatchWrite, SQLiteStore
from stockade.server._inputs import BodyField, fields

__all__ = ["TxWrite", "StoreOp", "StoreWrites", "parse_steps"]

_log = logging.getLogger("stockade.server")


@dataclass(frozen=True, slots=True)
class TxWrite:
    """One transaction for the writer thread: validated steps ``(op, key, value)``, in order."""

    scope: str
    token: FencingToken
    steps: tuple[tuple[Op, str, bytes], ...]


StoreOp = BatchWrite | TxWrite


def _field_error(name: str, error: InvalidArgument) -> BodyField:
    return BodyField(InvalidArgument(name, error.reason))


def parse_steps(document: dict[str, Any], *, value_bytes_max: int) -> tuple[tuple[Op, str, bytes], ...]:
    """The steps of a transaction body ``{"steps": [{"op", "key", "value_b64"?}, ...]}``, all validated.

    Raises:
        BodyField: a missing, unknown or bad field (422), more than `TX_WRITES_MAX`
            steps or a value over ``value_bytes_max`` (413). Nothing was touched.
    """
    fields(document, ("steps",))
    steps = document.get("steps")
    if not isinstance(steps, list):
        raise BodyField(InvalidArgument("steps", "is required: an array of steps"))
    if len(steps) > TX_WRITES_MAX:
        raise BodyField(LimitExceeded("TX_WRITES_MAX", TX_WRITES_MAX, f"{len(steps)} steps"))
    encoded_max = 4 * ((value_bytes_max + 2) // 3)
    parsed: list[tuple[Op, str, bytes]] = []
    for index, step in enumerate(steps):
        name = f"steps[{index}]"
        if not isinstance(step, dict):
            raise BodyField(InvalidArgument(name, "must be an object"))
        op = step.get("op")
        if op not in ("put", "delete"):
            raise BodyField(InvalidArgument(f"{name}.op", 'must be "put" or "delete"'))
        allowed = ("op", "key", "value_b64") if op == "put" else ("op", "key")
        unknown = sorted(set(step) - set(allowed))
        if unknown:
            raise BodyField(InvalidArgument(f"{name}.{unknown[0][:40]}",
                                            f"unknown field; a {op} step has {', '.join(allowed)}"))
        try:
            key = validate_key(step.get("key"))
        except InvalidArgument as exc:
            raise _field_error(f"{name}.key", exc) from None
        value = b""
        if op == "put":
            raw = step.get("value_b64")
            if not isinstance(raw, str):
                raise BodyField(InvalidArgument(f"{name}.value_b64", "is required in a put: the value in base64"))
            if len(raw) > encoded_max:  # refused before it is decoded
                raise BodyField(LimitExceeded("value_bytes_max", value_bytes_max, f"{name}.value_b64"))
            try:
                value = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise BodyField(InvalidArgument(f"{name}.value_b64", "must be base64 (RFC 4648, padded)")) from None
            if len(value) > value_bytes_max:
                raise BodyField(LimitExceeded("value_bytes_max", value_bytes_max, f"{name}.value_b64"))
        parsed.append((op, key, value))
    return tuple(parsed)


class StoreWrites:
    """What the store's writer thread runs: `run_batch` and `try_batch` of its `GroupCommitter`.

    A result slot holds a `WriteResult` (a single write), a list of them (a
    transaction), or the exception that request raised.
    """

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def try_batch(self, ops: Sequence[StoreOp]) -> Sequence[Any] | None:
        """On the loop: single writes only, and only if the file's lock is free; else None (to the thread)."""
        if any(isinstance(op, TxWrite) for op in ops):
            return None
        return self.store.try_apply_batch(ops)  # type: ignore[arg-type]

    def run_batch(self, ops: Sequence[StoreOp]) -> list[Any]:
        """In the writer thread: the batch in submission order."""
        if not any(isinstance(op, TxWrite) for op in ops):
            return self.store.apply_batch(ops)  # type: ignore[arg-type]  # the group commit as it always was
        results: list[Any] = []
        start = 0
        while start < len(ops):
            op = ops[start]
            if isinstance(op, TxWrite):
                results.append(self.transaction(op))
                start += 1
                continue
            end = start
            while end < len(ops) and not isinstance(ops[end], TxWrite):
                end += 1
            run = ops[start:end]
            try:
                results.extend(self.store.apply_batch(run))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - this run's requests get it; the others are not theirs
                _log.error("store batch of %d failed: %s", len(run), exc, extra={"batch_ops": len(run)})
                results.extend([exc] * len(run))
            start = end
        return results

    def transaction(self, op: TxWrite) -> list[WriteResult] | Exception:
        """Apply one transaction in one commit; its error (a refusal, or a bug) is its result."""
        try:
            with self.store.transaction(op.scope, token=op.token) as tx:
                for kind, key, value in op.steps:
                    if kind == "put":
                        tx.put(key, value)
                    else:
                        tx.delete(key)
        except Exception as exc:  # noqa: BLE001 - delivered to the one request it belongs to
            return exc
        invariant(tx.results is not None and len(tx.results) == len(op.steps),
                  "a committed transaction has one result per step")
        assert tx.results is not None  # for the type checker; invariant() above is the real check
        return tx.results
