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

It costs one INSERT per event and two point deletes, never a count (17 to 25
buffer accesses per event, 0.1 ms of the server's time, with 800 and with
110,000 events in the table; the first version, a range delete through
``IN (SELECT ...)``, planned a scan of the whole table: 33, 0.4 ms):

- ``n`` numbers a scope's events without a gap (one more than the scope's
  largest, read under the scope's lock that every caller holds), so the one
  event that falls out of the scope's window is ``n - HISTORY_PER_SCOPE``;
- ``seq`` (an identity) orders all events, and the one event
  ``HISTORY_TOTAL_MAX`` behind the new one goes; every `SWEEP_EVERY` events a
  range below that bound goes too: the events whose partner ``seq`` value was
  skipped (a rolled-back insert, the values a server crash skips) or locked.

Each delete skips a row another transaction has locked (that one is deleting
it), so units on different scopes never wait for each other here, and no two
wait for each other. Every statement looks rows up by a unique key, so its
plan does not depend on the table's size; a range (``seq <= bound``) would
also walk the index entries of every deleted row not yet vacuumed.

``at_unix_ms`` is the database server's clock when the event is written.
"""

from __future__ import annotations

import json
from typing import Any

from stockade.coordinators._postgres_coord_call import Prepared
from stockade.core.history import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["HISTORY_SCHEMA", "HISTORY_READ", "SWEEP_EVERY", "journal_function", "journal_statements",
           "events_of_row"]

#: Every this many events (by ``seq``) the global trim sweeps the range below its bound once.
SWEEP_EVERY = 1024

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


def journal_function(*, per_scope: int = HISTORY_PER_SCOPE, total_max: int = HISTORY_TOTAL_MAX,
                     sweep_every: int = SWEEP_EVERY) -> str:
    """The SQL of ``stockade_coord_journal``: write one event and trim the journal (the bounds are constants)."""
    return f"""
CREATE OR REPLACE FUNCTION stockade_coord_journal(p_scope text, p_kind text, p_holder text, p_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_seq bigint;
BEGIN
    -- Every caller holds the scope's lock: the scope's events are numbered one after the other.
    INSERT INTO stockade_coord_history AS h (scope, n, kind, holder, token)
        SELECT p_scope, COALESCE(max(o.n), 0) + 1, p_kind, p_holder, p_token
        FROM stockade_coord_history o WHERE o.scope = p_scope
        RETURNING h.seq, h.n INTO v_seq, v_n;
    DELETE FROM stockade_coord_history h WHERE h.ctid = (SELECT o.ctid FROM stockade_coord_history o
        WHERE o.scope = p_scope AND o.n = v_n - {per_scope} FOR UPDATE SKIP LOCKED);
    DELETE FROM stockade_coord_history h WHERE h.ctid = (SELECT o.ctid FROM stockade_coord_history o
        WHERE o.seq = v_seq - {total_max} FOR UPDATE SKIP LOCKED);
    IF v_seq % {sweep_every} = 0 THEN
        DELETE FROM stockade_coord_history h WHERE h.ctid = ANY(ARRAY(SELECT o.ctid FROM stockade_coord_history o
            WHERE o.seq > v_seq - {total_max + 2 * sweep_every} AND o.seq < v_seq - {total_max}
            FOR UPDATE SKIP LOCKED));
    END IF;
END
$$;
"""


#: Migration 4: the journal's table and function (the server rules are re-created beside it).
HISTORY_SCHEMA = _TABLE + journal_function()

#: A scope's last events, oldest first, in one row (what has committed), the server's time last.
HISTORY_READ = Prepared(
    "stockade_coord_history",
    "SELECT (SELECT json_agg(json_build_array(e.seq::text, e.kind, e.holder, e.token::text, e.at_unix_ms::text) "
    "ORDER BY e.n) FROM (SELECT * FROM stockade_coord_history WHERE scope = $1 ORDER BY n DESC LIMIT $2) AS e), "
    "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint",
    (json.loads, int),
)


def journal_statements(old: ScopeRecord, new: ScopeRecord) -> list[tuple[str, tuple[object, ...]]]:
    """The statements that journal the change ``old -> new``, one per event, for the change's own transaction."""
    return [("SELECT stockade_coord_journal(%s, %s, %s, %s)", (new.scope, kind, holder, token))
            for kind, holder, token in events_of(old, new)]


def events_of_row(scope: str, row: Any) -> list[HistoryEvent]:
    """The events of a `HISTORY_READ` row (numbers travel as text: JSON numbers may pass through floats)."""
    return [HistoryEvent(int(seq), scope, kind, holder, int(token), int(at_ms))
            for seq, kind, holder, token, at_ms in (row[0] if row is not None and row[0] else ())]
