"""One server-side statement in one round trip, with as little client work as the protocol allows.

The common cases of the PostgreSQL coordinator (a free scope's grant, a live
lease's release or renewal) are one call of a server-side function each
(`stockade.coordinators._postgres_coord_rows.SERVER_RULES`). On a host that
runs many clients, their CPU is what bounds the lock cycles per second, and
most of a call's client CPU was the driver's generic path (a cursor, query
conversion, the adapters, the wait loop): about 60 µs a call, against about
17 µs for libpq's own prepared-statement call. So a `Prepared` statement runs
here through the connection's libpq handle: prepared once per connection,
then one ``PQexecPrepared`` (which releases the GIL while it waits), its
parameters sent as text and its one row read as text into the types it names.

The rest is as for any statement: the server's errors are raised as psycopg's
(with their SQLSTATE), a statement runs within the session's
``statement_timeout``, and the connection's state is psycopg's to judge
(``closed``, ``broken``). A signal (Ctrl-C) is handled when the call returns,
at the latest after the statement timeout; the caller then gives back what
the call may have granted, as for any interrupted attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

__all__ = ["Prepared", "run_prepared"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A statement run by `run_prepared`.

    Attributes:
        name: its prepared-statement name (one per statement; ``stockade_`` first).
        sql: the statement, its parameters as ``$1``, ``$2``, ... (typed by the server).
        columns: how each column of its row is read from text (None stays None).
    """

    name: str
    sql: str
    columns: tuple[Callable[[str], Any], ...]


# The statements prepared on each connection (a connection's prepared statements end with it).
_prepared: WeakKeyDictionary[Any, set[str]] = WeakKeyDictionary()


def _param(value: object, encoding: str) -> bytes | None:
    if value is None:
        return None
    if value is True or value is False:
        return b"t" if value else b"f"
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, str):
        return value.encode(encoding)
    raise TypeError(f"a prepared statement's parameter must be None, bool, int or str, got {type(value).__name__}")


def run_prepared(conn: Any, statement: Prepared, params: Sequence[object]) -> tuple[Any, ...] | None:
    """Run ``statement`` with ``params`` on ``conn`` (an autocommit psycopg connection); its first row, or None.

    Raises:
        psycopg.Error: the server refused the statement or the connection failed,
            as psycopg raises it (``sqlstate`` set when the server answered).
    """
    from psycopg import errors, pq

    pgconn = conn.pgconn
    encoding = conn.info.encoding
    names = _prepared.get(conn)
    if names is None:
        names = _prepared[conn] = set()
    name = statement.name.encode("ascii")
    if statement.name not in names:
        result = pgconn.prepare(name, statement.sql.encode(encoding))
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise errors.error_from_result(result, encoding=encoding)
        names.add(statement.name)
    result = pgconn.exec_prepared(name, [_param(p, encoding) for p in params])
    if result.status != pq.ExecStatus.TUPLES_OK:
        raise errors.error_from_result(result, encoding=encoding)
    if result.ntuples == 0:
        return None
    return tuple(None if (raw := result.get_value(0, i)) is None else read(raw.decode(encoding))
                 for i, read in enumerate(statement.columns))
