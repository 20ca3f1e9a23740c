"""Protected tables of the PostgreSQL fence: the whole inheritance tree, and the DDL guard.

`stockade.resources.postgres` offers these as its `protect`, `unprotect` and
`install_ddl_guard`, inside its driver edge (a lost connection becomes
`BackendUnavailable` there). The rule of
what a protected tree is lives once, in SQL: ``stockade.cover`` in
`stockade.resources.postgres._sql` (the comment above it says why a trigger on
the named table alone is not enough). Here: the checks that need Python (is the
DDL guard there?), the errors as `InvalidArgument`, and the bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from stockade.core.errors import InvalidArgument
from stockade.core.limits import validate_scope
from stockade.resources.postgres import _sql as q
from stockade.transport.postgres import text_of

__all__ = ["protect", "unprotect", "install_ddl_guard", "ddl_guard_installed", "read_committed_transaction",
           "one_at_a_time", "ADDED_LATER"]

#: What `protect` does about partitions and children added to the tree later: ``"guarded"``
#: needs the DDL guard (they are covered by it), ``"unprotected"`` accepts, in words, that they
#: stay open until `protect` runs again.
ADDED_LATER = ("guarded", "unprotected")
_INSUFFICIENT_PRIVILEGE = "42501"
_NOT_OWNER_HINT = "the role that runs protect must own every table of the tree"


@contextmanager
def read_committed_transaction(conn: Any) -> Iterator[None]:
    """A transaction of ``conn`` at READ COMMITTED whatever the session's, the database's or the role's default.

    The fence's administration (`install`, `sync_keys`, `protect`, `unprotect`, `install_ddl_guard`) takes
    the install's lock, then reads and writes what the ones before it committed; at a default of REPEATABLE
    READ or SERIALIZABLE its snapshot was of before the lock, and installs at once failed (the version row
    not seen: a TypeError; or 40001 on it). Only a transaction begun here is set so: inside the caller's
    own, already begun, the caller's level stands (and its snapshot, if it has read, is taken).
    """
    begun_here = conn.info.transaction_status == TransactionStatus.IDLE
    with conn.transaction():
        if begun_here:
            conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        yield



def one_at_a_time(conn: Any) -> None:
    """Take the install's lock for this transaction: the fence's administration runs one at a time per database.

    Two `protect`s of one tree at once each dropped and created its triggers (one failed: the trigger already
    existed, or a deadlock); two `install_ddl_guard`s at once both created the event trigger (a unique
    violation); a `protect` beside an `unprotect` dropped a trigger the other had dropped.
    """
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (q.INSTALL_LOCK_KEY,))


def _relation(conn: Any, table: object) -> str:
    if not isinstance(table, str) or not table:
        raise InvalidArgument("table", "must be a table name")
    try:
        name = text_of(conn.execute("SELECT to_regclass(%s)::text", (table,)).fetchone()[0])
    except psycopg.errors.InvalidName:  # e.g. an unbalanced quote
        raise InvalidArgument("table", f"{table!r} is not a table name") from None
    if name is None:
        raise InvalidArgument("table", f"no table {table!r} in this database")
    return str(name)


def _refused(error: psycopg.Error, table: str) -> InvalidArgument | None:
    """The `InvalidArgument` a refusal of ``stockade.cover`` (or a missing privilege) stands for."""
    if error.sqlstate == q.PROTECT_SQLSTATE:
        return InvalidArgument("table", (error.diag.message_primary or str(error)).removeprefix("stockade: "))
    if error.sqlstate == _INSUFFICIENT_PRIVILEGE:
        return InvalidArgument("table", f"{table}: {error.diag.message_primary} ({_NOT_OWNER_HINT})")
    return None


def ddl_guard_installed(conn: Any) -> bool:
    """Whether the database has the DDL guard, enabled (`install_ddl_guard`)."""
    row = conn.execute("SELECT evtenabled FROM pg_event_trigger WHERE evtname = %s", (q.DDL_GUARD_NAME,)).fetchone()
    return row is not None and text_of(row[0]) != "D"


def install_ddl_guard(conn: Any) -> None:
    """Create the event trigger that protects a table added later to a protected tree (once per database).

    After ``CREATE TABLE ... PARTITION OF``, ``ATTACH PARTITION``, ``INHERITS``
    or ``ALTER TABLE ... INHERIT`` (foreign tables too), the new member gets
    the tree's trigger in the same transaction; a command that would leave a
    protected tree uncovered (a foreign table in it, a protected table attached
    under an unprotected one, two scopes in one tree) fails, and nothing of it
    is applied. PostgreSQL lets only a superuser create an event trigger.
    Idempotent.

    Raises:
        InvalidArgument: not a superuser, or `install` never ran in this database.
    """
    with read_committed_transaction(conn):
        one_at_a_time(conn)
        if conn.execute("SELECT to_regprocedure('stockade.ddl_guard()')").fetchone()[0] is None:
            raise InvalidArgument("conn", "the database has no stockade fence: run install() first")
        if not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            raise InvalidArgument("conn", "creating an event trigger needs a superuser (PostgreSQL's rule): "
                                          "run install_ddl_guard as one, once per database")
        conn.execute(f"DROP EVENT TRIGGER IF EXISTS {q.DDL_GUARD_NAME}")
        conn.execute(q.DDL_GUARD_SQL)


def protect(conn: Any, table: str, *, scope: str,
            added_later: Literal["guarded", "unprotected"] = "guarded") -> list[str]:
    """Make PostgreSQL refuse INSERT, UPDATE, DELETE, TRUNCATE and COPY without a current token on
    ``table`` and on every table that holds its rows: its partitions (at any depth) and inheritance children.

    A statement-level trigger on each of them runs ``stockade.fence`` again
    with the token this transaction passed for ``scope`` (the transaction-local
    setting only says where to find it; the MAC, the scope and the mark are
    checked again, under the same scope lock), so a writer that forgot its
    token, or carries a stale, forged or another scope's one, is refused by the
    database itself, whichever table of the tree it names. Running it again
    covers the tree as it is then. A partition or child added later is covered
    by the DDL guard (`install_ddl_guard`) in the DDL's own transaction.

    Args:
        conn: a connection of a role that owns every table of the tree and ran `install`.
        table: the root of the tree (a table with no parent).
        scope: the scope whose token opens the tree.
        added_later: ``"guarded"`` (the default) needs the DDL guard in the database;
            ``"unprotected"`` accepts, in words, that a table added to the tree later takes
            writes unchecked until `protect` runs again.

    Returns:
        The tables now protected (the tree's members, as PostgreSQL names them).

    Raises:
        InvalidArgument: a bad scope, no such table, a table that is a partition or child
            of another (protect the root), a tree with a foreign table, a table the role
            does not own, or no DDL guard with ``added_later="guarded"``. Nothing changes.
    """
    scope = validate_scope(scope)
    if added_later not in ADDED_LATER:
        raise InvalidArgument("added_later", f"must be one of {', '.join(ADDED_LATER)}")
    with read_committed_transaction(conn):
        one_at_a_time(conn)
        relation = _relation(conn, table)
        if added_later == "guarded" and not ddl_guard_installed(conn):
            raise InvalidArgument(
                "table", f"{relation}: a partition or child added to it later would take writes unchecked, "
                         "and no DDL guard is installed to cover it: a superuser runs install_ddl_guard(conn) "
                         "once in this database, or pass added_later='unprotected' to accept that tables "
                         "added later stay open until protect runs again")
        try:
            with conn.transaction():
                conn.execute("SELECT stockade.cover(%s::regclass, %s)", (relation, scope))
        except psycopg.Error as error:
            refusal = _refused(error, relation)
            if refusal is None:
                raise
            raise refusal from None
        conn.execute("INSERT INTO stockade.protected (relation, scope) VALUES (%s::regclass, %s) "
                     "ON CONFLICT (relation) DO UPDATE SET scope = excluded.scope", (relation, scope))
        rows = conn.execute("SELECT member::text FROM stockade.tree(%s::regclass) ORDER BY 1", (relation,)).fetchall()
    return [text_of(row[0]) for row in rows]


def unprotect(conn: Any, table: str) -> None:
    """Remove `protect`'s triggers from ``table`` and every table of its inheritance tree.

    Raises:
        InvalidArgument: no such table, or a table that is a partition or child (name the root).
    """
    with read_committed_transaction(conn):
        one_at_a_time(conn)
        relation = _relation(conn, table)
        roots = [(text_of(row[0]),) for row in conn.execute(
            "SELECT member::text FROM stockade.tree(%s::regclass) WHERE NOT has_parent", (relation,)).fetchall()]
        if (relation,) not in roots:
            raise InvalidArgument("table", f"{relation} is part of the inheritance tree of {roots[0][0]}: "
                                           "unprotect the root of the tree")
        members = [(text_of(row[0]),) for row in conn.execute(
            "SELECT member::text FROM stockade.tree(%s::regclass) WHERE scope IS NOT NULL", (relation,)).fetchall()]
        try:
            with conn.transaction():
                for (member,) in members:  # regclass text: quoted by PostgreSQL
                    conn.execute(f"DROP TRIGGER IF EXISTS stockade_fence ON {member}")
        except psycopg.Error as error:
            refusal = _refused(error, relation)
            if refusal is None:
                raise
            raise refusal from None
        conn.execute("DELETE FROM stockade.protected WHERE relation IN "
                     "(SELECT member FROM stockade.tree(%s::regclass))", (relation,))


def _control_protect_named_table_only(conn: Any, table: str, *, scope: str) -> None:
    """The control (the old `protect`): the trigger on the named table only, not on its tree."""
    with conn.transaction():
        relation = sql.SQL(_relation(conn, table))
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS stockade_fence ON {}").format(relation))
        conn.execute(sql.SQL("CREATE TRIGGER stockade_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {} "
                             "FOR EACH STATEMENT EXECUTE FUNCTION stockade.guard({})")
                     .format(relation, sql.Literal(validate_scope(scope))))
