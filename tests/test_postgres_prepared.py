"""The PostgreSQL coordinator's one-round-trip calls through libpq's prepared statements (real PostgreSQL 15).

The common cases (a free scope's grant, a live lease's release or renewal) run
as prepared statements on each pooled connection
(`stockade.coordinators.postgres._call`). What must hold: parameters and
answers keep their types and NULLs; a statement the server refuses is a
refusal (nothing granted, the connection kept); and a statement is prepared
again on the connection that replaces one the server ended. The control shares
the prepared names between connections, the bug put back: the call after a
lost session then fails. A unit rolled back keeps the connection's prepared
statements (control: psycopg preparing statements of its own, which it answers
a ROLLBACK for by deallocating them all, the coordinator's too).
"""

from __future__ import annotations

import os

import psycopg
import pytest

from stockade.coordinators import postgres as coordinator_module
from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres import _call as call
from stockade.coordinators.postgres._rows import LOCK_SCOPE
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted
from stockade.testing.servers import postgres as pg_helper

pytestmark = pytest.mark.skipif(
    not pg_helper.available() and os.environ.get("CI") != "true", reason="PostgreSQL 15 is not installed"
)

ECHO = call.Prepared("stockade_test_echo", "SELECT $1::text, $2::bigint, $3::boolean::text, $4::text, $5::text",
                     (str, int, str, str, str))


def test_parameters_and_answers_keep_their_types_and_nulls(pg_coord_url):
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        assert call.run_prepared(conn, ECHO, ("é-scope", 2**62, True, None, "x")) == ("é-scope", 2**62, "true", None,
                                                                                       "x")
        assert call.run_prepared(conn, ECHO, ("", -1, False, "y", None)) == ("", -1, "false", "y", None)
        none = call.Prepared("stockade_test_none", "SELECT 1 WHERE $1::bigint > 0", (int,))
        assert call.run_prepared(conn, none, (0,)) is None
        with pytest.raises(TypeError):
            call.run_prepared(conn, ECHO, ("a", 1.5, True, None, None))


def test_a_refused_statement_raises_with_its_sqlstate_and_the_connection_goes_on(pg_coord_url):
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        bad = call.Prepared("stockade_test_bad", "SELECT 1 / $1::int", (int,))
        with pytest.raises(psycopg.errors.DivisionByZero) as raised:
            call.run_prepared(conn, bad, (0,))
        assert raised.value.sqlstate == "22012"
        assert call.run_prepared(conn, bad, (1,)) == (1,)


def test_a_grant_refused_by_the_server_is_certain_to_have_done_nothing(pg_coord_url):
    coord = PostgresCoordinator(pg_coord_url, statement_timeout_ms=1_500)  # 300 ms: a free grant timed out at load
    try:
        with psycopg.connect(pg_coord_url) as other:  # holds the scope's lock: the grant's lock_timeout ends it
            other.execute(f"SELECT {LOCK_SCOPE.format(scope='%s')}", ("busy",))
            with pytest.raises(BackendUnavailable) as raised:
                coord.attempt("busy", lease_id="l" * 24, holder="h", ttl_ms=10_000, wait_ms=0)
            assert raised.value.certain_no_effect
        outcome = coord.attempt("busy", lease_id="m" * 24, holder="h", ttl_ms=10_000, wait_ms=0).outcome
        assert isinstance(outcome, Granted) and outcome.lease.lease_id == "m" * 24
        assert coord.release("m" * 24).released
    finally:
        coord.close()


def _cycles_across_a_lost_session(url: str) -> None:
    coord = PostgresCoordinator(url)
    try:
        coord.attempt("s0", lease_id="z" * 24, holder="h", ttl_ms=10_000, wait_ms=0)
        assert coord.release("z" * 24).released  # both statements are prepared on the pooled connection
        first = coord.attempt("s", lease_id="a" * 24, holder="h", ttl_ms=10_000, wait_ms=0).outcome
        assert isinstance(first, Granted)
        with psycopg.connect(url, autocommit=True) as admin:  # the server ends the pooled session
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%%'")
        with pytest.raises(BackendUnavailable):
            coord.release("a" * 24)
        assert coord.release("a" * 24).released  # a new connection: its statements are prepared on it
    finally:
        coord.close()


def test_statements_are_prepared_again_on_the_connection_after_a_lost_session(pg_coord_url):
    _cycles_across_a_lost_session(pg_coord_url)


class _SharedSession:
    """The bug put back: one record of prepared statements for every connection."""

    def __init__(self) -> None:
        self.session: object = None

    def get(self, conn: object) -> object:
        return self.session

    def __setitem__(self, conn: object, session: object) -> None:
        self.session = session


def test_control_names_shared_between_connections_fail_after_a_lost_session(pg_coord_url, monkeypatch):
    monkeypatch.setattr(call, "_sessions", _SharedSession())
    with pytest.raises(BackendUnavailable, match="does not exist"):
        _cycles_across_a_lost_session(pg_coord_url)


#: Units rolled back (an error inside each), each followed by a grant on the same pooled connection.
ROLLED_BACK_UNITS = 3
#: Lock cycles and looks before them: more than psycopg's threshold (5 runs of one statement) for preparing
#: statements of its own, were it on.
WARM_CYCLES = 8


def _grants_after_rolled_back_units(url: str) -> list[str]:
    """The grants that fail after a unit rolled back, one per unit (`ROLLED_BACK_UNITS`)."""
    coord = PostgresCoordinator(url)

    def cycle(scope: str) -> None:
        outcome = coord.attempt(scope, lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_ms=0).outcome
        assert isinstance(outcome, Granted)
        coord.release(outcome.lease.lease_id)

    failed = []
    try:
        for _ in range(WARM_CYCLES):
            cycle("warm")
            coord.inspect("warm")
        for n in range(ROLLED_BACK_UNITS):
            with pytest.raises(RuntimeError), coord.records.write("warm"):
                raise RuntimeError("an error inside the unit: the unit rolls back, its connection goes on")
            try:
                cycle(f"after-{n}")
            except BackendUnavailable as exc:
                failed.append(str(exc))
    finally:
        coord.close()
    return failed


def test_a_unit_rolled_back_keeps_the_connections_prepared_statements(pg_coord_url):
    """A rollback under READ COMMITTED too (any error inside a unit, a cancel, a timeout) left the pooled
    connection without its prepared statements (psycopg's DEALLOCATE ALL after a ROLLBACK, once it had
    prepared statements of its own): every later grant on it failed. 0 of 3 now."""
    assert _grants_after_rolled_back_units(pg_coord_url) == []


def test_control_psycopg_preparing_statements_of_its_own_loses_them_at_a_rollback(pg_coord_url, monkeypatch):
    """The control: psycopg's default threshold, the old behaviour: each grant after a rollback fails."""
    monkeypatch.setattr(coordinator_module, "PSYCOPG_PREPARE_THRESHOLD", 5)
    failed = _grants_after_rolled_back_units(pg_coord_url)
    print(f"\ncontrol: {len(failed)} of {ROLLED_BACK_UNITS} grants failed: {failed[:1]}")
    assert len(failed) == ROLLED_BACK_UNITS and all("26000" in text for text in failed), failed
