"""A database of schema version 8 (leases held, tokens issued, history) upgraded in place to the lease log (9).

The database is made as stockade of schema 8 made it: its tables by the frozen SQL of that version
(`stockade.coordinators.postgres._schema8`), its leases and tokens by its server-side functions,
called as its client calls them (`helpers.pg_schema8`). Then the current version connects, which
migrates. What must hold:

- every lease held stays held by its holder (C2), with its token, and its holder can still renew
  and release it by its lease id;
- every scope's next token is above every token issued before (C1), a lapsed lease expires as
  before (the engine's path finds and ends it), and the history keeps every event, in order;
- a process of version 8 still running fails on its next call with a typed error
  (`BackendUnavailable`) and writes nothing; one that connects afterwards is refused.

Control: a migration that loses the held leases (every row of the old history ended) hands a held
scope to someone else at once, and the test catches it.
"""

from __future__ import annotations

import psycopg
import pytest
from helpers.pg_schema8 import cycle_8, grant_8, install_schema_8

from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import PostgresCoordinator, PostgresRecords
from stockade.coordinators.postgres._call import Prepared
from stockade.coordinators.postgres._journal import LEASE_LOG
from stockade.coordinators.postgres._rows import MIGRATIONS, SERVER_RULES_9
from stockade.coordinators.postgres._schema8 import MIGRATIONS_8
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted, TimedOut

#: The grant of a process of version 8 (its client's prepared statement, as it sends it).
_GRANT_8 = Prepared("stockade_coord_grant", "SELECT token, now_ns FROM stockade_coord_grant($1, $2, $3, $4, $5)",
                    (int, int))
_KEEP_8 = Prepared("stockade_coord_keep", "SELECT scope, holder, token, ttl_ms, granted_ns, expires_ns, now_ns "
                   "FROM stockade_coord_keep($1, $2)", (str, str, int, int, int, int, int))
_HELD_KEPT = "CASE WHEN l.lease_id IS NULL THEN COALESCE(e.kind, '') END"


def _schema_8_in_use(url: str, monkeypatch) -> dict[str, object]:
    """Schema 8 with a lease held, a scope cycled five times, a lease left to lapse; what was issued."""
    install_schema_8(url, monkeypatch)
    with psycopg.connect(url, autocommit=True) as conn:
        cycled = [cycle_8(conn, "cycled") for _ in range(5)]
        held_id, held_token = grant_8(conn, "held", ttl_ms=600_000)
        _, lapsed_token = grant_8(conn, "lapsed", ttl_ms=1)
    return {"cycled": cycled, "held_id": held_id, "held_token": held_token, "lapsed_token": lapsed_token}


def _grant(coord: PostgresCoordinator, scope: str, wait_ms: int = 0) -> object:
    return coord.attempt(scope, lease_id=new_lease_id(), holder="new", ttl_ms=30_000, wait_ms=wait_ms).outcome


def _migrate_and_check(url: str, before: dict[str, object]) -> list[str]:
    """Connect with the current version (it migrates) and say what broke (empty: nothing)."""
    broken: list[str] = []
    coord = PostgresCoordinator(url)
    try:
        held = coord.inspect("held")
        if held.token is None or held.token.value != before["held_token"] or isinstance(_grant(coord, "held"), Granted):
            broken.append(f"the held lease was lost: {held}")
            return broken
        assert coord.renew(str(before["held_id"])).token.value == before["held_token"]  # its holder renews it
        assert coord.release(str(before["held_id"])).released  # and gives it back, by its lease id
        tokens = {scope: _grant(coord, scope) for scope in ("held", "cycled", "lapsed", "new-scope")}
        assert all(isinstance(outcome, Granted) for outcome in tokens.values()), tokens
        value = {scope: outcome.lease.token.value for scope, outcome in tokens.items()}
        if not (value["held"] > before["held_token"] and value["cycled"] > max(before["cycled"])
                and value["lapsed"] > before["lapsed_token"] and value["new-scope"] > 0):
            broken.append(f"a token did not rise: {value} after {before}")
        cycled = [(e.kind, e.token_value) for e in coord.records.history("cycled", 100)]
        expected = [(kind, t) for t in before["cycled"] for kind in ("grant", "release")]
        if cycled != expected + [("grant", value["cycled"])]:
            broken.append(f"the history of 'cycled' is {cycled}")
        lapsed = [(e.kind, e.token_value) for e in coord.records.history("lapsed", 100)]
        if lapsed != [("grant", before["lapsed_token"]), ("expire", before["lapsed_token"]),
                      ("grant", value["lapsed"])]:
            broken.append(f"the history of 'lapsed' is {lapsed}")
    finally:
        coord.close()
    return broken


def test_a_database_of_schema_8_in_use_migrates_in_place(pg_coord_url, monkeypatch):
    before = _schema_8_in_use(pg_coord_url, monkeypatch)
    assert _migrate_and_check(pg_coord_url, before) == []
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        version = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = 'schema_version'").fetchone()[0]
    assert version == str(len(MIGRATIONS)) == "14"


def test_control_a_migration_that_loses_the_held_leases_is_caught(pg_coord_url, monkeypatch):
    before = _schema_8_in_use(pg_coord_url, monkeypatch)
    assert LEASE_LOG.count(_HELD_KEPT) == 1
    monkeypatch.setattr(pg_module, "MIGRATIONS",
                        (*MIGRATIONS_8, LEASE_LOG.replace(_HELD_KEPT, "COALESCE(e.kind, '')") + SERVER_RULES_9,
                         *MIGRATIONS[9:]))
    broken = _migrate_and_check(pg_coord_url, before)
    assert len(broken) == 1 and broken[0].startswith("the held lease was lost"), broken


def test_a_process_of_version_8_fails_typed_after_the_migration_and_writes_nothing(pg_coord_url, monkeypatch):
    install_schema_8(pg_coord_url, monkeypatch)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS_8)
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", len(MIGRATIONS_8))
    old = PostgresRecords(pg_coord_url)  # a process of version 8, connected before the upgrade
    monkeypatch.undo()
    try:
        token, _ = old.call(_GRANT_8, ("s", new_lease_id(), "old", 30_000, 100_000))  # works before
        PostgresCoordinator(pg_coord_url).close()  # the upgrade, by a process of the new version
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            last = conn.execute("SELECT last_token FROM stockade_coord_scopes WHERE scope = 's'").fetchone()
        refused = []
        for statement, params in [(_GRANT_8, ("s2", new_lease_id(), "old", 30_000, 100_000)),
                                  (_KEEP_8, ("any-lease", True))]:
            with pytest.raises(BackendUnavailable, match="does not exist") as caught:
                old.call(statement, params)
            refused.append(caught.value.certain_no_effect)
        assert refused == [True, True]
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            after = conn.execute("SELECT last_token FROM stockade_coord_scopes WHERE scope = 's'").fetchone()
            assert conn.execute("SELECT count(*) FROM stockade_coord_scopes WHERE scope = 's2'").fetchone()[0] == 0
        assert after == last == (token,)
    finally:
        old.close()
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", len(MIGRATIONS_8))  # one that connects afterwards
    with pytest.raises(BackendUnavailable, match=f"schema version {len(MIGRATIONS)}, newer than this stockade"):
        PostgresCoordinator(pg_coord_url)


def test_the_held_lease_of_version_8_holds_off_a_new_waiter(pg_coord_url, monkeypatch):
    """C2 across the upgrade on the engine's path too: a waiter with a deadline times out behind it."""
    before = _schema_8_in_use(pg_coord_url, monkeypatch)
    coord = PostgresCoordinator(pg_coord_url)
    try:
        outcomes = [_grant(coord, "held", wait_ms=50) for _ in range(2)]
        assert [type(o).__name__ for o in outcomes] == ["Queued", "Queued"]
        deadline = coord.attempt("held", lease_id=new_lease_id(), holder="late", ttl_ms=30_000, wait_ms=0).outcome
        assert isinstance(deadline, TimedOut)
        info = coord.inspect("held")
        assert (info.holder, info.token.value) == ("holder-8", before["held_token"])
    finally:
        coord.close()
