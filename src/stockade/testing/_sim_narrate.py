"""Telling what happened: a minimal narrated trace of a violation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.testing.checkers import Violation
from stockade.testing.history import pair

if TYPE_CHECKING:
    from stockade.testing.sim import RunResult

__all__ = ["narrate"]

_S = 1_000_000_000


def _seconds(t_ns: float) -> str:
    return f"{t_ns / _S:9.6f}s"


def narrate(result: RunResult, violation: Violation | None = None, *, context: int = 12) -> str:
    """A minimal narrated trace of a violation: the offending operations and what led up to them.

    Shows the faults, lease grants and notes of the offending scope from a
    little before the first offending operation to the last one, and every
    operation of the offending processes in that window.
    """
    violation = violation or (result.violations[0] if result.violations else None)
    records = result.history
    ops = pair(records)
    by_invoke = {op.invoke_index: op for op in ops}
    lines = [f"seed {result.seed}" + (f", mutant {result.mutant}" if result.mutant else "")]
    lines.append(f"options: {result.options.describe()}")
    if violation is None:
        return "\n".join(lines + ["no violation"])
    lines.append(str(violation))
    offending = [by_invoke[i] for i in violation.indices if i in by_invoke]
    # P11 names the read/write lock's own records (a hold, a validation): their clients are the offenders.
    locked = [i for i in violation.indices if i < len(records) and records[i].get("process") == "rwlock"]
    if not offending and not locked:
        return "\n".join(lines)
    scopes = {op.scope for op in offending}
    processes = {op.process for op in offending} | {(records[i].get("value") or {}).get("client") for i in locked}
    first = min([op.invoke_index for op in offending] + locked)
    last = max([op.complete_index if op.complete_index is not None else op.invoke_index for op in offending]
               + locked)
    # Start a few records before the first offending operation, or where its process got its lease (for the
    # lock's records: where its acquisitions could have begun).
    leases = [op.invoke_index for op in ops if op.process in processes and op.f == "acquire" and op.type == "ok"
              and op.scope in scopes and op.invoke_index < first]
    start = max(0, min(first - (4 * context if locked else context), max(leases) if leases else first))
    lines.append("trace:")
    shown = 0
    for index in range(start, last + 1):
        record = records[index]
        process = record.get("process")
        if process == "coordinator":
            if violation.property == "P9" and record.get("scope") in scopes:
                lines.append(f"  {_seconds(record['t_ns'])}  {'co':>4} {_lease_log_text(record)}")
                shown += 1
            continue
        if process == "rwlock":
            value = record.get("value") or {}
            if value.get("client") in processes:
                lines.append(f"  {_seconds(record['t_ns'])}  {'rw':>4} c{value.get('client')} {record.get('f')} "
                             + ", ".join(f"{k}={v}" for k, v in value.items() if k != "client"))
                shown += 1
            continue
        if process in ("nemesis", "note"):
            value = record.get("value")
            if process == "note" and not any(str(value).startswith(f"c{p} ") for p in processes):
                continue
            detail = value if isinstance(value, str) else _fault_text(record.get("f", ""), value)
            lines.append(f"  {_seconds(record['t_ns'])}  {'~~':>4} {detail}")
            shown += 1
            continue
        op = by_invoke.get(index)
        if op is None:
            continue
        relevant = op.process in processes or (op.scope in scopes and op.f == "acquire" and op.type == "ok")
        relevant = relevant or op in offending
        if not relevant or op.final:
            continue
        mark = "!!" if op in offending else "  "
        end = "  ...unknown" if op.complete_ns == float("inf") else f"→{_seconds(op.complete_ns).strip()}"
        lines.append(f"  {_seconds(op.invoke_ns)}  {mark:>4} {op.describe()}  ({end})")
        shown += 1
    lines.append(f"({shown} of {last + 1 - start} records in the window shown)")
    return "\n".join(lines)


def _lease_log_text(record: dict[str, Any]) -> str:
    value = record.get("value") or {}
    text = f"coordinator {record.get('f')} {record.get('scope')}"
    if "token" in value:
        text += f" token {value['token']}"
    text += f" at {_seconds(value.get('at_ns', 0)).strip()} on clock {value.get('clock')}"
    if "expires_ns" in value:
        text += f", expires {_seconds(value['expires_ns']).strip()}"
    return text


def _fault_text(f: str, value: Any) -> str:
    if not isinstance(value, dict):
        return f
    if f == "restore":
        return (f"restore from backup at commit {value.get('backup_commit_seq')}: floor {value.get('floor')}, "
                f"high-water now {value.get('high_water')}, rolled back {len(value.get('rolled_back', []))} writes")
    if f in ("pause", "clock-jump"):
        return f"{f} {value.get('process')} {value.get('ms')} ms" + (
            f" ({value['reason']})" if value.get("reason") else "")
    return f"{f} {value}"

