"""The PostgreSQL coordinator's journal as a test reads it, and the bug the controls put back.

`agreement` reads a scope's record and its journal in one snapshot and says
where they disagree. Since schema version 9 the journal is the lease log
(a lease's row is its grant event, and its end in place is the end event), so
what can disagree is the scope row's last token and the log. `defer_journal`
is the wrong way to journal: each change commits first and its rows in the
log go in a transaction of their own afterwards (the lease engine's path only: the one-statement rules are
switched off), so a kill -9 or a failing insert in between leaves a change
without its event.
"""

from __future__ import annotations

import psycopg

from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres import _rows as _postgres_coord_rows
from stockade.coordinators.postgres._journal import log_statements
from stockade.coordinators.postgres._rows import HELD, LOCK_SCOPE

#: The journal of schema versions 4 to 6, as they created it: each scope's events numbered (``n``),
#: and each event deleting its scope's event 100 behind and the table's event 100,000 behind.
SCHEMA_6_HISTORY = """
CREATE TABLE IF NOT EXISTS stockade_coord_history (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope text NOT NULL,
    n bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('grant', 'release', 'expire')),
    holder text NOT NULL,
    token bigint NOT NULL,
    at_unix_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    UNIQUE (scope, n)
);
CREATE OR REPLACE FUNCTION stockade_coord_journal(p_scope text, p_kind text, p_holder text, p_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_seq bigint;
BEGIN
    INSERT INTO stockade_coord_history AS h (scope, n, kind, holder, token)
        SELECT p_scope, COALESCE(max(o.n), 0) + 1, p_kind, p_holder, p_token
        FROM stockade_coord_history o WHERE o.scope = p_scope
        RETURNING h.seq, h.n INTO v_seq, v_n;
    DELETE FROM stockade_coord_history h WHERE h.ctid = (SELECT o.ctid FROM stockade_coord_history o
        WHERE o.scope = p_scope AND o.n = v_n - 100 FOR UPDATE SKIP LOCKED);
    DELETE FROM stockade_coord_history h WHERE h.ctid = (SELECT o.ctid FROM stockade_coord_history o
        WHERE o.seq = v_seq - 100000 FOR UPDATE SKIP LOCKED);
END
$$;
"""


def agreement(url: str, scope: str) -> list[str]:
    """Where ``scope``'s record and its journal (the lease log) disagree (empty: they agree), in one snapshot."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        row = conn.execute(f"SELECT s.last_token, l.token FROM stockade_coord_scopes s LEFT JOIN LATERAL "
                           f"{HELD.format(scope='s.scope')} AS l ON true WHERE s.scope = %s", (scope,)).fetchone()
        rows = conn.execute("SELECT token, grant_ms IS NOT NULL, end_kind, end_ms IS NOT NULL FROM stockade_coord_log "
                            "WHERE scope = %s ORDER BY seq", (scope,)).fetchall()
    events = []
    for token, granted, end_kind, ended in rows:
        events += [("grant", token)] if granted else []
        events += [(end_kind, token)] if ended and end_kind else []
    grants = [token for kind, token in events if kind == "grant"]
    if row is None or not grants:
        return ["nothing recorded"]
    last_token, held = row
    problems = []
    if grants[-1] != last_token:
        problems.append(f"last grant in the journal {grants[-1]}, last token {last_token}")
    if (held is not None) != (events[-1][0] == "grant"):
        problems.append(f"record {'holds' if held is not None else 'holds no'} lease, last event {events[-1][0]}")
    for (kind_a, token_a), (kind_b, token_b) in zip(events, events[1:], strict=False):
        if (kind_a == "grant") == (kind_b == "grant") or (kind_a == "grant" and token_a != token_b):
            problems.append(f"{kind_a} {token_a} then {kind_b} {token_b}")
    return problems


class defer_journal:  # noqa: N801 - used as a function that returns the deferred writer
    """Put the bug back on ``coord``: its changes commit without their events; calling this writes them.

    Patches the module (this process only) and turns the one-statement rules off.
    """

    def __init__(self, coord: PostgresCoordinator, url: str) -> None:
        self.later: list[tuple[str, tuple[object, ...]]] = []

        def deferred(old, new):  # type: ignore[no-untyped-def]
            self.later.extend(log_statements(old, new))
            return []

        _postgres_coord_rows.log_statements = deferred  # type: ignore[assignment]
        coord.server_rules = False
        self.conn = psycopg.connect(url, autocommit=True)

    def __call__(self) -> None:
        with self.conn.transaction():  # the events, in a commit of their own, under the scopes' locks
            for sql, params in self.later:
                self.conn.execute(f"SELECT {LOCK_SCOPE.format(scope='%s')}", (params[0],))
                self.conn.execute(sql, params)
        self.later.clear()

    def close(self) -> None:
        self.conn.close()
