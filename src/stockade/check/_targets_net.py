"""The networked resources of `stockade check`: the user's PostgreSQL and Redis (drivers imported on use).

PostgreSQL: the fence (`stockade.resources.postgres`) must already be installed
in the database (the check installs nothing outside its scratch table); the
writes go to a scratch table ``stockade_check_<hex>``, created and dropped by
the check. With the ``fencing-off`` control the same statement runs in a
transaction that never calls the fence, as an application that forgot it.

Redis: the writes are fenced ``SET``s (`stockade.resources.redis`) of keys
``{<scope>}:<key>``; the Redis fence keeps no operation ids (R3), so retries
are whole-value writes here and the count of applications is not observed.
"""

from __future__ import annotations

from typing import Any

from stockade.check.targets import Outcome, Target
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.tokens import FencingToken
from stockade.timeline import SetupLine
from stockade.transport.postgres import text_of

__all__ = ["PostgresTarget", "RedisTarget", "postgres_target", "redis_target"]


class PostgresTarget(Target):
    """The user's PostgreSQL database, fenced by `stockade.resources.postgres`."""

    kind = "postgresql"
    op_ids = True

    def __init__(self, url: str, scratch: str, **options: Any) -> None:
        super().__init__(url, scratch, **options)
        from psycopg import sql

        from stockade.resources.postgres import PostgresFence

        self.fence = PostgresFence(url, keys=self.keys, connect_timeout_s=5)
        self.conn = self.fence.connect()
        if self.conn.execute("SELECT to_regclass('stockade.settings') IS NOT NULL").fetchone()[0] is not True:
            self.conn.close()
            raise InvalidArgument("resource", "the fence is not installed in this database (run "
                                              "stockade.resources.postgres.install); the check installs nothing")
        self.client_encoding = self._as_an_application()
        self.table = sql.Identifier(scratch.replace("-", "_"))
        self.upsert = sql.SQL("INSERT INTO {} (scope, key, value, n) VALUES (%s, %s, %s, 1) ON CONFLICT (scope, key) "
                              "DO UPDATE SET value = excluded.value, n = {}.n + 1").format(self.table, self.table)

    def _as_an_application(self) -> str:
        """Put the connection in the database's own client encoding, as an application's plain connection is
        (stockade's own connections ask for UTF8): on SQL_ASCII psycopg then hands text back as bytes, and the
        cases run ``fenced`` on such a connection. UTF8 kept where psycopg has no codec (EUC_TW, MULE_INTERNAL)."""
        import psycopg

        server = text_of(self.conn.execute("SHOW server_encoding").fetchone()[0])
        try:
            self.conn.execute(f"SET client_encoding = '{server}'")
            self.conn.execute("SELECT 'x'::text").fetchone()
        except (psycopg.NotSupportedError, psycopg.errors.InvalidParameterValue):
            self.conn.execute("SET client_encoding = 'UTF8'")
        return str(text_of(self.conn.execute("SHOW client_encoding").fetchone()[0]))

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        from stockade.resources.postgres import fenced

        if self.control == "fencing-off":  # the table written without the fence
            with self.conn.transaction():
                self.conn.execute(self.upsert, (scope, key, value))
            return Outcome("applied")
        with fenced(self.conn, token, scope, keys=self.keys, op_id=op_id):
            self.conn.execute(self.upsert, (scope, key, value))
        return Outcome("applied")

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        from psycopg import sql

        row = self.conn.execute(sql.SQL("SELECT value, n FROM {} WHERE scope = %s AND key = %s").format(self.table),
                                (scope, key)).fetchone()
        return (None, 0) if row is None else (text_of(row[0]), int(row[1]))

    def create_scratch(self) -> None:
        from psycopg import sql

        self.conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (scope text NOT NULL, key text NOT NULL, value text, "
                                  "n int NOT NULL DEFAULT 0, PRIMARY KEY (scope, key))").format(self.table))

    def remove_scratch(self, scopes: list[str]) -> None:
        from psycopg import sql

        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))

    def _one(self, query: str) -> Any:
        import psycopg

        try:
            with self.conn.transaction():
                row = self.conn.execute(query).fetchone()
        except psycopg.Error as exc:
            return f"unreadable ({str(exc).strip().splitlines()[0]})"
        return None if row is None else text_of(row[0])

    def setup_lines(self) -> list[SetupLine]:
        isolation = str(self._one("SHOW default_transaction_isolation"))
        encoding = str(self._one("SHOW server_encoding"))
        installed = self._one("SELECT to_regclass('stockade.settings') IS NOT NULL")
        version = self._one("SELECT version FROM stockade.version") if installed is True else None
        owner = self._one("SELECT r.rolname FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
                          "WHERE n.nspname = 'stockade'")
        others = self._one("SELECT coalesce(string_agg(r.rolname, ', ' ORDER BY r.rolname), '') FROM pg_roles r, "
                           "pg_namespace n WHERE n.nspname = 'stockade_private' AND r.oid <> n.nspowner "
                           "AND r.rolcanlogin AND NOT r.rolsuper AND has_schema_privilege(r.oid, n.oid, 'USAGE')")
        supersede = self._one("SELECT r.rolsuper OR pg_has_role(r.oid, 'pg_signal_backend', 'MEMBER') "
                              "FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = 'stockade'")
        writer_super = self._one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        return [
            SetupLine("fence schema installed", f"yes, version {version}, owner {owner}" if installed is True
                      else "no: run stockade.resources.postgres.install", "ok" if installed is True else "FAIL"),
            SetupLine("default isolation level", isolation,
                      "ok" if isolation == "read committed" else "warn" if isolation in (
                          "repeatable read", "serializable") else "FAIL"),
            SetupLine("database encoding", f"{encoding} (the cases' client_encoding: {self.client_encoding})",
                      "ok" if encoding in ("UTF8", "SQL_ASCII", "LATIN1", "EUC_JP")
                      or encoding.startswith(("WIN", "ISO_", "LATIN", "KOI8")) else "warn"),
            SetupLine("other login roles that can take the fence's locks", others or "none",
                      "ok" if others == "" else "FAIL"),
            SetupLine("supersession granted (owner superuser or in pg_signal_backend)", str(supersede),
                      "ok" if supersede is True else "warn"),
            SetupLine("writer connects as a superuser", str(writer_super), "warn" if writer_super is True else "ok"),
            self._protected_line(),
        ]

    def _protected_line(self) -> SetupLine:
        """The tables `protect` covers: every member of each tree (its partitions, at any depth, and inheritance
        children) must carry an enabled trigger of the tree's scope; triggers must fire
        (``session_replication_role``); a tree with members wants the DDL guard (docs/fence-postgres.md)."""
        import psycopg

        name = "protected tables (every partition and child carries the trigger)"
        try:
            with self.conn.transaction():
                trees = self.conn.execute(
                    "WITH fenced AS (SELECT relation AS rel FROM stockade.protected UNION SELECT tgrelid::regclass "
                    " FROM pg_trigger WHERE tgname = 'stockade_fence' AND tgfoid = 'stockade.guard()'::regprocedure), "
                    "roots AS (SELECT DISTINCT t.member AS root FROM fenced f, stockade.tree(f.rel) t "
                    " WHERE NOT t.has_parent), "
                    "scoped AS (SELECT r.root, coalesce((SELECT p.scope FROM stockade.protected p "
                    " WHERE p.relation = r.root), (SELECT min(t.scope) FROM stockade.tree(r.root) t)) AS scope "
                    " FROM roots r) "
                    "SELECT s.root::text, s.scope, (SELECT count(*) FROM stockade.tree(s.root)), "
                    "(SELECT string_agg(t.member::text, ', ' ORDER BY t.member::text) FROM stockade.tree(s.root) t "
                    " LEFT JOIN pg_trigger g ON g.tgrelid = t.member AND g.tgname = 'stockade_fence' "
                    " WHERE t.scope IS DISTINCT FROM s.scope OR g.tgenabled IN ('D', 'R')) "
                    "FROM scoped s ORDER BY 1").fetchall()
                replica = self.conn.execute("SHOW session_replication_role").fetchone()[0]
                guard = self.conn.execute("SELECT evtenabled FROM pg_event_trigger WHERE evtname = "
                                          "'stockade_ddl_guard'").fetchone()
        except psycopg.Error as exc:
            return SetupLine(name, f"unreadable ({str(exc).strip().splitlines()[0]})", "warn")
        if not trees:
            return SetupLine(name, "none", "ok")
        found = "; ".join(f"{rel} (scope {scope}, {members} table{'s' if members != 1 else ''})"
                          for rel, scope, members, _ in trees)
        open_ = [f"{missing} (in the tree of {rel})" for rel, _, _, missing in trees if missing]
        if open_:
            return SetupLine(name, f"{found}; NOT COVERED: {'; '.join(open_)}: writes there take no token "
                                   "(run protect on the root again)", "FAIL")
        if str(replica) == "replica":
            return SetupLine(name, f"{found}; session_replication_role = replica: the triggers do not fire",
                             "FAIL")
        if guard is None or str(guard[0]) == "D":
            return SetupLine(name, f"{found}; no DDL guard: a partition or child added later takes writes "
                                   "unchecked until protect runs again", "warn")
        return SetupLine(name, f"{found}; DDL guard installed", "ok")

    def close(self) -> None:
        self.conn.close()


class RedisTarget(Target):
    """The user's Redis, fenced by `stockade.resources.redis`."""

    kind = "redis"

    def __init__(self, url: str, scratch: str, **options: Any) -> None:
        super().__init__(url, scratch, **options)
        from stockade.resources.redis import RedisFence

        self.fence = RedisFence.from_url(url, keys=self.keys, cluster_id=self.cluster_id, socket_timeout=10,
                                         socket_connect_timeout=5)
        self.written: set[str] = set()
        self._reached(self.fence.client.ping)  # the client connects on first use: unreachable is bad input here

    def _reached(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(...)``, a Redis that cannot be reached raised as `BackendUnavailable` (one line, exit 2)."""
        import redis

        try:
            return call(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.fence.client.close()
            raise BackendUnavailable(f"resource {self.url}: cannot reach Redis: {exc}", certain_no_effect=True) \
                from None

    def _key(self, scope: str, key: str) -> str:
        return "{" + scope + "}:" + key

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        self.written.add(self._key(scope, key))
        if self.control == "fencing-off":  # a plain SET, as an application that forgot the fence would
            self.fence.client.set(self._key(scope, key), value)
            return Outcome("applied")
        self.fence.set(token, self._key(scope, key), value)
        return Outcome("applied", self.fence.high_water(scope))

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        data = self.fence.client.get(self._key(scope, key))
        return (None if data is None else data.decode() if isinstance(data, bytes) else str(data)), -1

    def remove_scratch(self, scopes: list[str]) -> None:
        for scope in scopes:
            keys = self._reached(list, self.fence.client.scan_iter(match=self._key(scope, "*"), count=100))
            if keys:
                self._reached(self.fence.client.delete, *keys)

    def _config(self, name: str) -> str:
        try:
            answer = self.fence.client.config_get(name)
        except Exception as exc:  # noqa: BLE001 - an ACL may refuse CONFIG: reported as a line, not raised
            return f"unreadable ({exc})"
        value = answer.get(name, answer.get(name.encode(), "?"))
        return value.decode() if isinstance(value, bytes) else str(value)

    def setup_lines(self) -> list[SetupLine]:
        appendonly, fsync, policy = self._config("appendonly"), self._config("appendfsync"), self._config(
            "maxmemory-policy")
        return [
            SetupLine("appendonly", appendonly, "ok" if appendonly == "yes" else "warn"),
            SetupLine("appendfsync", fsync, "ok" if fsync == "always" else "warn"),
            SetupLine("maxmemory-policy (eviction)", policy,
                      "FAIL" if policy.startswith("allkeys-") else "ok" if policy != "?" else "warn"),
        ]

    def close(self) -> None:
        try:
            self.fence.close()
        except BackendUnavailable:
            pass


def postgres_target(rest: str) -> type[Target]:
    """`stockade.resources.registry.CHECK_TARGETS`' entry for a PostgreSQL url (checked when opened)."""
    return PostgresTarget


def redis_target(rest: str) -> type[Target]:
    """`stockade.resources.registry.CHECK_TARGETS`' entry for a Redis url (checked when opened)."""
    return RedisTarget
