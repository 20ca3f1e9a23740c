"""The PostgreSQL coordinator's lease history: a table written in the transaction of each change.

Every change of a scope's record writes its events (`stockade.core.journal.events_of`)
in the same transaction as the change, so both commit or neither does
(docs/history.md). Both ways a change is made call one server-side function,
``stockade_coord_journal(scope, kind, holder, token)``:

- the lease engine's units queue it beside the change's own statements
  (`journal_statements`, from `record_writes`), sent with the COMMIT in the
  same round trip;
- the one-statement grant and release (`SERVER_RULES`) PERFORM it inside
  their function. A renewal records nothing.

It costs one INSERT per event, into a table indexed by ``seq`` and by
``(scope, seq)``, and nothing else: no count, no read, no per-event delete.

- ``seq`` (an identity) orders all events; a scope's events are read newest
  first through ``(scope, seq)`` and at most `HISTORY_PER_SCOPE` of them
  (`HISTORY_READ`), so a scope shows its last 100 events without a per-scope
  trim (one event 100 behind deleted at each write, as schema versions 4 to 6
  did, costs about 60 µs of the server's time per event).
- The bound on the table is ``HISTORY_TOTAL_MAX`` events behind the newest
  ``seq``: every `SWEEP_EVERY` events the one whose ``seq`` is a multiple of it
  deletes the range ``(seq - total_max - SWEEP_WINDOWS * sweep_every, seq - total_max]``.
  Each ``seq`` value falls in `SWEEP_WINDOWS` such ranges, so an event is left
  behind only if that many sweeping transactions in a row never commit (a
  ``seq`` a rollback or a server crash skipped sweeps nothing). Between sweeps
  the table holds up to ``sweep_every - 1`` events more than the bound.

A sweep skips a row another transaction has locked (that one is deleting it),
so units on different scopes never wait for each other here, and no two wait
for each other. A sweep's range is bounded, so its cost does not grow with the
table (an open range ``seq <= bound`` would also walk the index entries of
every deleted row not yet vacuumed).

``at_unix_ms`` is the database server's clock when the event is written.
"""

from __future__ import annotations

import json
from typing import Any

from stockade.coordinators.postgres._call import Prepared
from stockade.core.journal import HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["HISTORY_SCHEMA", "HISTORY_APPEND_ONLY", "HISTORY_READ", "SWEEP_EVERY", "SWEEP_WINDOWS",
           "journal_function", "journal_statements", "events_of_row"]

#: Every this many events (by ``seq``) the trim sweeps a range below its bound.
SWEEP_EVERY = 1024
#: How many sweeps cover each ``seq`` value (consecutive sweeps' ranges overlap).
SWEEP_WINDOWS = 4

_TABLE = """
CREATE TABLE IF NOT EXISTS stockade_coord_history (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('grant', 'release', 'expire')),
    holder text NOT NULL,
    token bigint NOT NULL,
    at_unix_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
);
"""
#: A scope's events, newest first, without a scan (`HISTORY_READ`).
_SCOPE_INDEX = "CREATE INDEX IF NOT EXISTS stockade_coord_history_scope ON stockade_coord_history (scope, seq);\n"


def journal_function(*, total_max: int = HISTORY_TOTAL_MAX, sweep_every: int = SWEEP_EVERY,
                     sweep_windows: int = SWEEP_WINDOWS) -> str:
    """The SQL of ``stockade_coord_journal``: append one event, and now and then trim (the bounds are constants)."""
    return f"""
CREATE OR REPLACE FUNCTION stockade_coord_journal(p_scope text, p_kind text, p_holder text, p_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
BEGIN
    INSERT INTO stockade_coord_history AS h (scope, kind, holder, token) VALUES (p_scope, p_kind, p_holder, p_token)
        RETURNING h.seq INTO v_seq;
    IF v_seq % {sweep_every} = 0 THEN
        DELETE FROM stockade_coord_history h WHERE h.ctid = ANY(ARRAY(SELECT o.ctid FROM stockade_coord_history o
            WHERE o.seq > v_seq - {total_max + sweep_windows * sweep_every} AND o.seq <= v_seq - {total_max}
            FOR UPDATE SKIP LOCKED));
    END IF;
END
$$;
"""


#: Migration 4: the journal's table and function (the server rules are re-created beside it).
HISTORY_SCHEMA = _TABLE + _SCOPE_INDEX + journal_function()

#: Migration 7: the journal appends only. A table of schema 4 to 6 loses its per-scope number ``n``
#: (and the unique index on ``(scope, n)``) and is read through ``(scope, seq)``.
HISTORY_APPEND_ONLY = ("ALTER TABLE stockade_coord_history DROP COLUMN IF EXISTS n;\n"
                       + _SCOPE_INDEX + journal_function())

#: A scope's last events, oldest first, in one row (what has committed), the server's time last.
HISTORY_READ = Prepared(
    "stockade_coord_history",
    "SELECT (SELECT json_agg(json_build_array(e.seq::text, e.kind, e.holder, e.token::text, e.at_unix_ms::text) "
    "ORDER BY e.seq) FROM (SELECT * FROM stockade_coord_history WHERE scope = $1 ORDER BY seq DESC LIMIT $2) AS e), "
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
