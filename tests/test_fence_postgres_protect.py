"""Protected tables of the PostgreSQL fence: every table that holds the rows (docs/fence-postgres.md).

An application role that does not own the tables writes, with no token, to
every table of two protected trees: a partitioned table (its partitions, a
sub-partition, a partition created after `protect` and one attached after it)
and an inheritance tree (a child, and a child created after `protect`). Each
of INSERT, UPDATE, DELETE, TRUNCATE and COPY on each table is one vector;
every one must be refused and leave the data as it was. The control is the
old `protect` (the trigger on the named table only, no DDL guard): the same
vectors get through.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from stockade.core.errors import InvalidArgument
from stockade.resources import postgres as pg
from stockade.resources.postgres import _protect as _postgres_protect
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available, drop_database, fresh_database, shared_server

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

SCOPE = "orders"
#: table -> an id inside its range (the row each vector's INSERT and COPY write)
TABLES = {
    "parent": 10, "p1": 20, "p2": 120, "p2a": 120, "p2b": 170, "p_created_later": 220, "p_attached_later": 320,
    "base": 1, "base_child": 2, "base_child_later": 3,
}
LATER = ("p_created_later", "p_attached_later", "base_child_later")
OPERATIONS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "COPY")

TREE = """
CREATE TABLE parent (id int NOT NULL, v text NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE p1 PARTITION OF parent FOR VALUES FROM (0) TO (100);
CREATE TABLE p2 PARTITION OF parent FOR VALUES FROM (100) TO (200) PARTITION BY RANGE (id);
CREATE TABLE p2a PARTITION OF p2 FOR VALUES FROM (100) TO (150);
CREATE TABLE p2b PARTITION OF p2 FOR VALUES FROM (150) TO (200);
CREATE TABLE base (id int NOT NULL, v text NOT NULL);
CREATE TABLE base_child (extra int) INHERITS (base);
"""
LATER_DDL = """
CREATE TABLE p_created_later PARTITION OF parent FOR VALUES FROM (200) TO (300);
CREATE TABLE p_attached_later (id int NOT NULL, v text NOT NULL);
ALTER TABLE parent ATTACH PARTITION p_attached_later FOR VALUES FROM (300) TO (400);
CREATE TABLE base_child_later () INHERITS (base);
"""


@dataclass
class Roles:
    server: PostgresServer
    dbname: str
    owner: str
    app: str

    def connect(self, role: str) -> psycopg.Connection:
        return psycopg.connect(self.server.dsn_of(self.dbname) + f" user={role}", autocommit=True)


def _roles(guard: bool) -> Iterator[Roles]:
    """A database whose tables an owner role owns (it installs the fence) and an app role only writes."""
    server = shared_server()
    name = fresh_database(server)
    roles = Roles(server, name, f"{name}_owner", f"{name}_app")
    with psycopg.connect(server.dsn_of(name), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {roles.owner} LOGIN")
        admin.execute(f"CREATE ROLE {roles.app} LOGIN")
        admin.execute(f'GRANT CREATE ON DATABASE "{name}" TO {roles.owner}')
        admin.execute(f"GRANT CREATE ON SCHEMA public TO {roles.owner}")
        with roles.connect(roles.owner) as owner:
            pg.install(owner, keys=KEYS)
        if guard:
            pg.install_ddl_guard(admin)
    try:
        yield roles
    finally:
        drop_database(server, name)
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {roles.owner}")
            admin.execute(f"DROP ROLE IF EXISTS {roles.app}")


@pytest.fixture
def guarded() -> Iterator[Roles]:
    yield from _roles(guard=True)


@pytest.fixture
def unguarded() -> Iterator[Roles]:
    yield from _roles(guard=False)


def _build(roles: Roles, protect: str) -> None:
    """The trees, protected by the owner (``protect``: "new" or "control"), then the tables added later."""
    with roles.connect(roles.owner) as owner:
        owner.execute(TREE)
        for root in ("parent", "base"):
            if protect == "new":
                pg.protect(owner, root, scope=SCOPE)
            else:
                _postgres_protect._control_protect_named_table_only(owner, root, scope=SCOPE)
        owner.execute(LATER_DDL)
        owner.execute(f"GRANT ALL ON {', '.join(TABLES)} TO {roles.app}")
        with pg.fenced(owner, tok(5, scope=SCOPE)):
            for table, key in TABLES.items():
                if table not in ("parent", "p2", "base"):  # a row in every table that holds rows
                    owner.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 'seed')", (key,))


def _state(conn: psycopg.Connection) -> list[tuple[str, int, str]]:
    rows = conn.execute("SELECT tableoid::regclass::text, id, v FROM parent UNION ALL "
                        "SELECT tableoid::regclass::text, id, v FROM base ORDER BY 1, 2").fetchall()
    return [tuple(row) for row in rows]


def _attempt(conn: psycopg.Connection, operation: str, table: str, key: int) -> bool:
    """One write with no token, in its own transaction; True if it committed."""
    try:
        if operation == "COPY":
            with conn.cursor() as cur, cur.copy(f"COPY {table} (id, v) FROM STDIN") as copy:
                copy.write_row((key + 1, "evil"))
        else:
            conn.execute({"INSERT": f"INSERT INTO {table} (id, v) VALUES ({key + 1}, 'evil')",
                          "UPDATE": f"UPDATE {table} SET v = 'evil'",
                          "DELETE": f"DELETE FROM {table}",
                          "TRUNCATE": f"TRUNCATE {table}"}[operation])
        return True
    except psycopg.Error as error:
        assert error.sqlstate == pg.NO_TOKEN_SQLSTATE, (operation, table, error)
        return False


def _vectors(roles: Roles) -> tuple[list[str], int]:
    """Every vector from the app role; the ones that got through, and how many were tried."""
    through = []
    with roles.connect(roles.app) as app:
        for table, key in TABLES.items():
            for operation in OPERATIONS:
                if _attempt(app, operation, table, key):
                    through.append(f"{operation} {table}")
    return through, len(TABLES) * len(OPERATIONS)


def test_every_table_that_holds_the_rows_refuses_a_write_without_a_token(guarded: Roles) -> None:
    _build(guarded, "new")
    with guarded.connect(guarded.owner) as owner:
        before = _state(owner)
        through, tried = _vectors(guarded)
        print(f"protect: {len(through)} of {tried} unprotected writes got through: {through}")
        assert (through, tried) == ([], 50)
        assert _state(owner) == before
    with guarded.connect(guarded.app) as app:  # the current holder writes to every table of the trees
        for table, key in TABLES.items():
            with pg.fenced(app, tok(6, scope=SCOPE)):
                app.execute(f"UPDATE {table} SET v = 'paid' WHERE id = %s", (key,))
        assert {v for _, _, v in _state(app)} == {"paid"}


def test_control_the_old_protect_lets_writes_through_partitions_and_children(unguarded: Roles) -> None:
    _build(unguarded, "control")
    through, tried = _vectors(unguarded)
    print(f"control (trigger on the named table only): {len(through)} of {tried} got through: {through}")
    assert len(through) == 40  # every vector on every partition and child; only the two roots refuse
    assert all(vector.split()[1] not in ("parent", "base") for vector in through)


def test_protect_refuses_without_the_ddl_guard_unless_told_in_words(unguarded: Roles) -> None:
    with unguarded.connect(unguarded.owner) as owner:
        owner.execute(TREE)
        with pytest.raises(InvalidArgument, match="install_ddl_guard"):
            pg.protect(owner, "parent", scope=SCOPE)
        assert owner.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'stockade_fence'").fetchone() == (0,)
        covered = pg.protect(owner, "parent", scope=SCOPE, added_later="unprotected")
        assert covered == ["p1", "p2", "p2a", "p2b", "parent"]


def test_protect_refuses_a_member_and_the_ddl_guard_refuses_what_it_cannot_cover(guarded: Roles) -> None:
    with guarded.connect(guarded.owner) as owner:
        owner.execute(TREE)
        with pytest.raises(InvalidArgument, match="protect the root of the tree, public.parent"):
            pg.protect(owner, "p2a", scope=SCOPE)
        with pytest.raises(InvalidArgument, match="protect the root of the tree, public.base"):
            pg.protect(owner, "base_child", scope=SCOPE)
        for bad in ("no_such_table", "", 'a"b'):
            with pytest.raises(InvalidArgument):
                pg.protect(owner, bad, scope=SCOPE)
        with pytest.raises(InvalidArgument):
            pg.protect(owner, "parent", scope="..")
        assert owner.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'stockade_fence'").fetchone() == (0,)
        pg.protect(owner, "base", scope=SCOPE)
        owner.execute("CREATE TABLE loose (id int NOT NULL, v text NOT NULL)")
        pg.protect(owner, "loose", scope="other")
        with pytest.raises(psycopg.Error) as info:  # two scopes in one tree
            owner.execute("ALTER TABLE loose INHERIT base")
        assert info.value.sqlstate == "SKF03"
        owner.execute("CREATE TABLE outer_parent (id int NOT NULL, v text NOT NULL)")
        with pytest.raises(psycopg.Error) as info:  # writes through outer_parent would reach base's rows
            owner.execute("ALTER TABLE base INHERIT outer_parent")
        assert info.value.sqlstate == "SKF03" and "protect(public.outer_parent) first" in str(info.value)
        assert owner.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outer_parent'::regclass"
                             ).fetchone() == (0,)
        with pytest.raises(InvalidArgument, match="unprotect the root"):
            pg.unprotect(owner, "base_child")
        pg.unprotect(owner, "base")
        assert owner.execute("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                             "WHERE t.tgname = 'stockade_fence' AND c.relname LIKE 'base%'").fetchone() == (0,)


def test_install_ddl_guard_needs_a_superuser(guarded: Roles) -> None:
    with guarded.connect(guarded.owner) as owner, pytest.raises(InvalidArgument, match="superuser"):
        pg.install_ddl_guard(owner)
