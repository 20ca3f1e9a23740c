"""This process as stockade of schema version 9 ran: its migrations, its functions, its advisory locks.

Schema 9 locked a scope with ``pg_advisory_xact_lock(SCOPE_LOCK_CLASS, hashtext(scope))``, which any
role that may connect can take; 10 locks a view no other role can name
(`stockade.coordinators.postgres._rows.LOCK_VIEWS`). `as_schema_9` points the current client at
schema 9's SQL (the migrations up to 9, the functions' names, the lock statements, the timeline's
key), so that a coordinator opened afterwards in this process installs and runs schema 9 exactly:
the control of the tests of the lock views (tests/test_postgres_lock_views.py).
"""

from __future__ import annotations

from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import _tx as pg_tx
from stockade.coordinators.postgres._call import Prepared
from stockade.coordinators.postgres._rows import ADVISORY_LOCK, MIGRATIONS, RULE_NAMES_9, TIMELINE_KEY

#: The grant and the keep of a process of schema 9 (its client's prepared statements, as it sent them).
GRANT_9 = Prepared(RULE_NAMES_9[0], f"SELECT token, now_ns FROM {RULE_NAMES_9[0]}($1, $2, $3, $4, $5)", (int, int))
KEEP_9 = Prepared(RULE_NAMES_9[1], "SELECT scope, holder, token, ttl_ms, granted_ns, expires_ns, now_ns "
                  f"FROM {RULE_NAMES_9[1]}($1, $2)", (str, str, int, int, int, int, int))


def as_schema_9(monkeypatch) -> None:
    """Make this process's PostgreSQL coordinator the one of schema 9 (``monkeypatch.undo()`` ends it)."""
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:9])
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", 9)
    monkeypatch.setattr(pg_module, "_GRANT", GRANT_9)
    monkeypatch.setattr(pg_module, "_KEEP", KEEP_9)
    monkeypatch.setattr(pg_module, "TIMELINE_KEY", "timeline")
    for name in ("_META", "_META_SCOPE", "_META_LEASE"):
        monkeypatch.setattr(pg_module, name, getattr(pg_module, name).replace(f"'{TIMELINE_KEY}'", "'timeline'"))
    monkeypatch.setattr(pg_module, "_LOCK_SCOPE", f"SELECT %s::text, {ADVISORY_LOCK.format(scope='%s')}")
    monkeypatch.setattr(pg_module, "_LOCK_LEASE", pg_module._LOCK_LEASE.replace(
        pg_module.LOCK_SCOPE.format(scope="s.scope"), ADVISORY_LOCK.format(scope="s.scope")))
    monkeypatch.setattr(pg_tx, "LOCK_SCOPE", ADVISORY_LOCK)
