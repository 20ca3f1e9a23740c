"""Histories: what every fault test records and every checker reads.

A history is a list of plain dicts, one per event, in a JSON-lines form with
Jepsen's semantics (the properties judged on it are defined in docs/rules.md)::

    {"t_ns": 1200000, "process": 3, "type": "invoke", "f": "write", "scope": "a",
     "token": "stk1.<cluster>.7.a", "key": "k0", "value": "3-17", "idempotency_key": "3-17"}
    {"t_ns": 1900000, "process": 3, "type": "ok", "f": "write", ...}

- ``type`` is ``invoke``, then exactly one of ``ok`` (it happened), ``fail``
  (it certainly had no effect, e.g. a stale-token 409) or ``info`` (unknown:
  a timeout, a reset, a killed process). A process has at most one operation
  outstanding, so a completion belongs to its process's last invocation.
- ``f`` is ``acquire | renew | release | write | read`` for client processes.
  The fault injector writes single ``info`` records with ``process:
  "nemesis"`` and an ``f`` naming the fault (``crash-coordinator``,
  ``restart-resource``, ``restore`` …). Checkers ignore what they do not
  know, and read three of them (see `stockade.testing.checkers`).
- ``token`` is the encoded token (``stk1.…``) or its integer value. A stale
  rejection carries ``error: "stale-token"`` and the resource's
  ``high_water``.

The resource's **audit trail** is a separate list of accepted, durable
commits ``(scope, token, idempotency_key, commit_seq)`` in commit order: a
white-box oracle that is never rolled back (a restore reports what it
removed instead).

`pair` turns a history into `Op` objects (invocation + completion), which is
what the checkers work on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from stockade.core.errors import InvalidArgument
from stockade.core.tokens import FencingToken

__all__ = [
    "History",
    "Op",
    "AuditEntry",
    "pair",
    "token_parts",
    "dump_jsonl",
    "load_jsonl",
    "normalize_audit",
    "INFINITY_NS",
    "RECORD_FIELDS",
]

#: The completion time of an operation whose outcome is unknown.
INFINITY_NS = math.inf

#: The record fields of the history form (extra fields, such as ``high_water`` or ``final``, are allowed).
RECORD_FIELDS = ("t_ns", "process", "type", "f", "scope", "token", "key", "value", "idempotency_key", "error")


class History:
    """An append-only recorder of history records (dicts).

    A client process calls `invoke` then `complete`; the fault injector calls
    `nemesis`. ``records`` is the history itself.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._open: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.records)

    def invoke(self, t_ns: int, process: Any, f: str, **fields: Any) -> int:
        """Record an invocation; returns its index. A process may have one open operation."""
        if process in self._open:
            raise InvalidArgument("process", f"process {process!r} already has an open operation")
        record = {"t_ns": t_ns, "process": process, "type": "invoke", "f": f}
        record.update({k: v for k, v in fields.items() if v is not None})
        self.records.append(record)
        self._open[process] = len(self.records) - 1
        return len(self.records) - 1

    def complete(self, t_ns: int, process: Any, type_: str, **fields: Any) -> int:
        """Record the completion (``ok``/``fail``/``info``) of ``process``'s open operation.

        Fields not given are copied from the invocation (scope, key, token …).
        """
        if type_ not in ("ok", "fail", "info"):
            raise InvalidArgument("type", f"must be ok, fail or info, got {type_!r}")
        index = self._open.pop(process, None)
        if index is None:
            raise InvalidArgument("process", f"process {process!r} has no open operation")
        record = dict(self.records[index])
        record["t_ns"] = t_ns
        record["type"] = type_
        record.update({k: v for k, v in fields.items() if v is not None})
        self.records.append(record)
        return len(self.records) - 1

    def is_open(self, process: Any) -> bool:
        return process in self._open

    def nemesis(self, t_ns: int, f: str, **fields: Any) -> int:
        """Record a fault (or a heal) as one ``info`` record of process ``"nemesis"``."""
        record = {"t_ns": t_ns, "process": "nemesis", "type": "info", "f": f}
        record.update({k: v for k, v in fields.items() if v is not None})
        self.records.append(record)
        return len(self.records) - 1


def dump_jsonl(records: Iterable[dict[str, Any]], out: IO[str]) -> None:
    """Write records as JSON lines (the form described in docs/simulation.md)."""
    for record in records:
        out.write(json.dumps(record, sort_keys=True, separators=(",", ":")))
        out.write("\n")


def load_jsonl(source: IO[str] | Iterable[str]) -> list[dict[str, Any]]:
    """Read JSON lines back into records (blank lines are skipped)."""
    return [json.loads(line) for line in source if line.strip()]


def token_parts(token: Any, scope: str | None = None) -> tuple[str | None, str | None, int | None]:
    """``(cluster, scope, value)`` of a token given encoded, as an int, or as a `FencingToken`.

    An integer carries no cluster or scope: ``scope`` (the record's) is used.
    Returns ``(None, None, None)`` for a missing or unparseable token.
    """
    if token is None:
        return None, None, None
    if isinstance(token, FencingToken):
        return token.cluster, token.scope, token.value
    if isinstance(token, bool):
        return None, None, None
    if isinstance(token, int):
        return None, scope, token
    if isinstance(token, str):
        try:
            parsed = FencingToken.decode(token)
        except InvalidArgument:
            return None, None, None
        return parsed.cluster, parsed.scope, parsed.value
    return None, None, None


@dataclass(slots=True)
class Op:
    """One operation: an invocation and its completion, as the checkers see it.

    ``complete_ns`` is `INFINITY_NS` when the outcome is unknown (``info``, or
    no completion at all): such an operation may take effect at any time after
    its invocation, or never.
    """

    id: int
    process: Any
    f: str
    type: str  # ok | fail | info
    invoke_ns: int
    complete_ns: float
    invoke_index: int
    complete_index: int | None
    scope: str | None
    token: int | None
    cluster: str | None
    token_scope: str | None
    key: Any
    value: Any
    idempotency_key: Any
    error: Any
    high_water: int | None
    final: bool

    def describe(self) -> str:
        """A one-line narration, e.g. ``p3 write a/k0=3-17 token 7 -> ok``."""
        parts = [f"p{self.process}" if isinstance(self.process, int) else str(self.process), self.f]
        if self.scope is not None:
            parts.append(self.scope + (f"/{self.key}" if self.key is not None else ""))
        if self.f == "write" and self.value is not None:
            parts[-1] += f"={self.value}"
        if self.token is not None:
            parts.append(f"token {self.token}")
        outcome = self.type
        if self.f == "read" and self.type == "ok":
            outcome += f" {self.value!r}"
        if self.error:
            outcome += f" ({self.error}" + (f", high-water {self.high_water})" if self.high_water is not None else ")")
        return " ".join(parts) + f" -> {outcome} [#{self.invoke_index}]"


def pair(records: list[dict[str, Any]]) -> list[Op]:
    """Pair invocations with completions (per process, in order).

    Returns the operations in invocation order; ``Op.id`` is that position.
    An invocation that never completes is an ``info`` operation. Records of
    the nemesis, and completions without an invocation, are skipped.
    """
    ops: list[Op] = []
    open_by_process: dict[Any, Op] = {}
    for index, record in enumerate(records):
        process = record.get("process")
        kind = record.get("type")
        if process == "nemesis":
            continue
        if kind == "invoke":
            stale = open_by_process.pop(process, None)
            if stale is not None:
                stale.type = "info"
            cluster, token_scope, value = token_parts(record.get("token"), record.get("scope"))
            op = Op(
                id=len(ops),
                process=process,
                f=record.get("f", ""),
                type="info",
                invoke_ns=record.get("t_ns", 0),
                complete_ns=INFINITY_NS,
                invoke_index=index,
                complete_index=None,
                scope=record.get("scope"),
                token=value,
                cluster=cluster,
                token_scope=token_scope,
                key=record.get("key"),
                value=record.get("value"),
                idempotency_key=record.get("idempotency_key"),
                error=None,
                high_water=None,
                final=bool(record.get("final", False)) or process == "final",
            )
            ops.append(op)
            open_by_process[process] = op
        elif kind in ("ok", "fail", "info"):
            completed = open_by_process.pop(process, None)
            if completed is None:
                continue
            completed.type = kind
            completed.complete_index = index
            if kind != "info":
                completed.complete_ns = record.get("t_ns", completed.invoke_ns)
            if record.get("token") is not None:
                parts = token_parts(record.get("token"), record.get("scope"))
                completed.cluster, completed.token_scope, completed.token = parts
            if completed.f == "read" or record.get("value") is not None:
                completed.value = record.get("value")
            completed.error = record.get("error")
            completed.high_water = record.get("high_water")
    return ops


def _value_of(value: int | None) -> int:
    if value is None:
        raise ValueError("an audit record needs a token with a value")
    return value


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One accepted, durable commit of the resource."""

    scope: str
    token: int
    idempotency_key: Any
    commit_seq: int


def normalize_audit(audit: Iterable[Any]) -> list[AuditEntry]:
    """Accept tuples ``(scope, token, idempotency_key, commit_seq)`` or dicts; order by ``commit_seq``."""
    entries = []
    for item in audit:
        if isinstance(item, AuditEntry):
            entries.append(item)
        elif isinstance(item, dict):
            _, _, value = token_parts(item["token"], item["scope"])
            key, seq = item.get("idempotency_key"), item["commit_seq"]
            entries.append(AuditEntry(item["scope"], _value_of(value), key, seq))
        else:
            scope, token, key, seq = item
            _, _, value = token_parts(token, scope)
            entries.append(AuditEntry(scope, _value_of(value), key, seq))
    entries.sort(key=lambda e: e.commit_seq)
    return entries

