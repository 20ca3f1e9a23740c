"""One server-side statement in one round trip, with as little client work as the protocol allows.

The common cases of the PostgreSQL coordinator (a free scope's grant, a live
lease's release or renewal) are one call of a server-side function each
(`stockade.coordinators.postgres._rows.SERVER_RULES`). On a host that
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


#: libpq's ``ExecStatusType`` values (stable since PostgreSQL 7): a statement done, a statement with rows.
_COMMAND_OK = 1
_TUPLES_OK = 2


class _Session:
    """What this module knows of one connection's session: its encoding, the statements prepared on it."""

    __slots__ = ("encoding", "names")

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.names: set[str] = set()


# Per connection: a session's prepared statements end with it, and a new connection has none.
_sessions: WeakKeyDictionary[Any, _Session] = WeakKeyDictionary()


def _refused(result: Any, encoding: str) -> Exception:
    from psycopg import errors

    return errors.error_from_result(result, encoding=encoding)


def run_prepared(conn: Any, statement: Prepared, params: Sequence[object]) -> tuple[Any, ...] | None:
    """Run ``statement`` with ``params`` on ``conn`` (an autocommit psycopg connection); its first row, or None.

    Raises:
        TypeError: a parameter is not None, a bool, an int or a str (nothing is sent).
        psycopg.Error: the server refused the statement or the connection failed,
            as psycopg raises it (``sqlstate`` set when the server answered).
    """
    session = _sessions.get(conn)
    if session is None:
        session = _sessions[conn] = _Session(conn.info.encoding)
    encoding = session.encoding
    values: list[bytes | None] = []
    for value in params:  # a loop, not a call per value: this runs twice per lock cycle
        if value is None:
            values.append(None)
        elif value is True or value is False:
            values.append(b"t" if value else b"f")
        elif isinstance(value, int):
            values.append(str(value).encode("ascii"))
        elif isinstance(value, str):
            values.append(value.encode(encoding))
        else:
            raise TypeError(f"a prepared statement's parameter must be None, bool, int or str, "
                            f"got {type(value).__name__}")
    pgconn = conn.pgconn
    name = statement.name.encode("ascii")
    if statement.name not in session.names:
        result = pgconn.prepare(name, statement.sql.encode(encoding))
        if result.status != _COMMAND_OK:
            raise _refused(result, encoding)
        session.names.add(statement.name)
    result = pgconn.exec_prepared(name, values)
    if result.status != _TUPLES_OK:
        raise _refused(result, encoding)
    if result.ntuples == 0:
        return None
    row: list[Any] = []
    for column, read in enumerate(statement.columns):
        raw = result.get_value(0, column)
        row.append(None if raw is None else read(raw.decode(encoding)))
    return tuple(row)
