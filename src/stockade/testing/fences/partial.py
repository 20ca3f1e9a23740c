"""Each fence target's ways to fail a unit's later write (`stockade.testing.conformance.fence_partial`).

One declaration per kind of adapter, named by each target's descriptor (`stockade.testing.fences.targets`);
the ways reach into the harnesses' units (test code over test code).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import sqlalchemy.exc

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.testing.conformance.fence_partial import FailingWrite, NotApplicable, PartialFailures
from stockade.testing.fences.redis import data_key

# -- Redis: the five triggers of issue 26 and the other refusals, each after the unit's first SET ----------

_BIG = 2**62
_LAST_ID = "18446744073709551615-18446744073709551615"


def _redis(name: str, stored: str | None, increments: list[int], *, wrongtype: bool = False) -> FailingWrite:
    def prepare(harness: Any, scope: str, key: str) -> None:
        if stored is not None:
            harness.plain.set(data_key(scope, f"{key}-n"), stored)

    def add(harness: Any, unit: Any, key: str) -> None:
        counter = data_key(unit._scope, f"{key}-n")
        if wrongtype:
            unit._batch.hset(counter, {"f": b"1"})
        for amount in increments:
            unit._batch.incrby(counter, amount)

    return FailingWrite(name, add, (InvalidArgument,), prepare)


def _redis_stream_full() -> FailingWrite:
    def prepare(harness: Any, scope: str, key: str) -> None:
        harness.plain.xadd(data_key(scope, f"{key}-s"), {"e": "1"}, id=_LAST_ID)

    def add(harness: Any, unit: Any, key: str) -> None:
        unit._batch.xadd(data_key(unit._scope, f"{key}-s"), {"e": b"2"})

    return FailingWrite("xadd-on-a-stream-at-its-last-id", add, (InvalidArgument,), prepare)


REDIS = PartialFailures(
    refused=(
        _redis("two-incrby-2**62", None, [_BIG, _BIG]),
        _redis("incrby-of-01", "01", [1]),
        _redis("incrby-of-minus-0", "-0", [1]),
        _redis("incrby-of-007", "007", [1]),
        _redis("incrby-of-18-digits-past-2**63", "999999999999999999", [_BIG, _BIG]),
        _redis("hset-on-a-string", "text", [], wrongtype=True),
        _redis_stream_full(),
    ),
    injected=NotApplicable(
        "a batch reaches Redis as one script call when its block ends: no point between its writes is open to "
        "a fault but a command Redis refuses (the refused ways), and a Redis killed mid-script keeps none of "
        "it (tests/test_fence_redis.py S16)"),
)

# -- SQL: the user's own statements inside the fenced transaction -------------------------------------------


def _sql_ways(execute: Any, placeholder: str, table: str, errors: tuple[type[BaseException], ...]) -> PartialFailures:
    insert = f"INSERT INTO {table} (scope, key, value) VALUES ({placeholder}, {placeholder}, {placeholder})"

    def not_null(harness: Any, unit: Any, key: str) -> None:
        execute(unit, insert, (unit._scope, f"{key}-null", None))

    def duplicate(harness: Any, unit: Any, key: str) -> None:
        execute(unit, insert, (unit._scope, key, b"again"))  # the key the unit just wrote

    return PartialFailures(
        refused=(FailingWrite("not-null-violation", not_null, errors),
                 FailingWrite("duplicate-primary-key", duplicate, errors)),
        injected=NotApplicable(
            "the unit is the database's own transaction: a fault after its first write is a failed statement "
            "(the refused ways) or a lost connection or server, which the database rolls back whole (S16, "
            "kill -9, in the adapter's own tests)"),
    )


SQLITE = _sql_ways(lambda unit, sql, args: unit._execute(sql, args), "?", "user_data",
                   (sqlite3.IntegrityError, sqlalchemy.exc.IntegrityError))
POSTGRES = _sql_ways(lambda unit, sql, args: unit._harness.execute(sql, args), "%s", "kv",
                     (psycopg.errors.IntegrityError, sqlalchemy.exc.IntegrityError))

# -- files and stockade's store ------------------------------------------------------------------------------


def _bad_name(harness: Any, unit: Any, key: str) -> None:
    unit.write(f"{key}/nested", b"x")


FILES = PartialFailures(
    refused=(FailingWrite("a-name-with-a-slash", _bad_name, (InvalidArgument,)),),
    injected=NotApplicable(
        "a directory batch is atomic one file at a time (docs/fence-files.md): an I/O fault during its renames "
        "leaves the files renamed before it, the mark already raised, and is reported as BackendUnavailable "
        "'failed after N files' (outcome partial)"),
)


def _oversize_key(harness: Any, unit: Any, key: str) -> None:
    unit.write("k" * 2000, b"x")


def _fault_in_the_unit(harness: Any, unit: Any, key: str) -> None:
    def fail(write: Any, *, token_value: int) -> Any:
        raise BackendUnavailable("injected: the resource failed after the unit's first write")

    unit._tx._unit.apply = fail
    unit.write(f"{key}-faulted", b"x")


STORE = PartialFailures(
    refused=(FailingWrite("a-key-over-1-KiB", _oversize_key, (InvalidArgument,)),),
    injected=(FailingWrite("the-unit-fails-its-second-write", _fault_in_the_unit, (BackendUnavailable,)),),
)
