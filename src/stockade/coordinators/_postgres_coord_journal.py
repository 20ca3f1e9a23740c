"""The PostgreSQL coordinator's lease history: a table written in the transaction of each change.

Every change of a scope's record writes its events (`stockade.core.history.events_of`)
in the same transaction as the change, so both commit or neither does
(docs/history.md). Both ways a change is made call one server-side function,
``stockade_coord_journal(scope, kind, holder, token)``:

- the lease engine's units queue it beside the change's own statements
  (`journal_statements`, from `record_writes`), sent with the COMMIT in the
  same round trip;
- the one-statement grant and release (`SERVER_RULES`) PERFORM it inside
  their function. A renewal records nothing.

It costs one INSERT per event and two point deletes, never a count:

- ``n`` numbers a scope's events without a gap (one more than the scope's
  largest, read under the scope's lock that every caller holds), so the one
  event that falls out of the scope's window is ``n - HISTORY_PER_SCOPE``;
- ``seq`` (an identity) orders all events; the events ``HISTORY_TOTAL_MAX``
  behind the newest go by a short range of ``seq`` (`TRIM_WINDOW` wide, so
  that the few values a rolled-back insert or a server crash skips do not
  leave an event behind), skipping rows a concurrent trim has locked, so
  that units on different scopes never wait for each other here.

``at_unix_ms`` is the database server's clock when the event is written.
"""

from __future__ import annotations

from typing import Any

from stockade.core.history import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["HISTORY_SCHEMA", "HISTORY_READ", "TRIM_WINDOW", "journal_function", "journal_statements",
           "events_of_row"]

#: How many ``seq`` values below the global bound each event's trim looks at.
TRIM_WINDOW = 64

_TABLE = """
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
"""


def journal_function(*, per_scope: int = HISTORY_PER_SCOPE, total_max: int = HISTORY_TOTAL_MAX) -> str:
    """The SQL of ``stockade_coord_journal``: write one event and trim the journal (the bounds are constants)."""
    return f"""
CREATE OR REPLACE FUNCTION stockade_coord_journal(p_scope text, p_kind text, p_holder text, p_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_seq bigint;
BEGIN
    -- Every caller holds the scope's lock: the scope's events are numbered one after the other.
    SELECT COALESCE(max(h.n), 0) + 1 INTO v_n FROM stockade_coord_history h WHERE h.scope = p_scope;
    INSERT INTO stockade_coord_history (scope, n, kind, holder, token) VALUES (p_scope, v_n, p_kind, p_holder, p_token)
        RETURNING seq INTO v_seq;
    DELETE FROM stockade_coord_history h WHERE h.scope = p_scope AND h.n = v_n - {per_scope};
    DELETE FROM stockade_coord_history h WHERE h.seq IN (
        SELECT o.seq FROM stockade_coord_history o
        WHERE o.seq > v_seq - {total_max + TRIM_WINDOW} AND o.seq <= v_seq - {total_max}
        FOR UPDATE SKIP LOCKED);
END
$$;
"""


#: Migration 4: the journal's table and function (the server rules are re-created beside it).
HISTORY_SCHEMA = _TABLE + journal_function()

#: A scope's last events, oldest first, in one row (what has committed), the server's time last.
HISTORY_READ = (
    "SELECT (SELECT json_agg(json_build_array(e.seq::text, e.kind, e.holder, e.token::text, e.at_unix_ms::text) "
    "ORDER BY e.n) FROM (SELECT * FROM stockade_coord_history WHERE scope = %s ORDER BY n DESC LIMIT %s) AS e), "
    "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint"
)


def journal_statements(old: ScopeRecord, new: ScopeRecord) -> list[tuple[str, tuple[object, ...]]]:
    """The statements that journal the change ``old -> new``, one per event, for the change's own transaction."""
    return [("SELECT stockade_coord_journal(%s, %s, %s, %s)", (new.scope, kind, holder, token))
            for kind, holder, token in events_of(old, new)]


def events_of_row(scope: str, row: Any) -> list[HistoryEvent]:
    """The events of a `HISTORY_READ` row (numbers travel as text: JSON numbers may pass through floats)."""
    return [HistoryEvent(int(seq), scope, kind, holder, int(token), int(at_ms))
            for seq, kind, holder, token, at_ms in (row[0] if row is not None and row[0] else ())]
