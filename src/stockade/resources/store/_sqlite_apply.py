"""Applying an admitted write to the SQLite store's tables, inside the caller's open transaction.

The fence check has already passed when these run (`SQLiteStore` admits,
then applies, in one ``BEGIN IMMEDIATE`` transaction): they write the data,
the audit record and the idempotency record, and prune both bounded tables.
"""

from __future__ import annotations

import sqlite3

from stockade.core.values import Write, WriteResult

__all__: list[str] = []  # private to the SQLite adapter


def next_seq(conn: sqlite3.Connection) -> int:
    # fetchall: a RETURNING statement must run to completion before COMMIT.
    rows = conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'commit_seq' RETURNING value").fetchall()
    return rows[0][0]


def apply_write(
    conn: sqlite3.Connection, write: Write, token_value: int, high_water: int, *,
    audit_records_max: int, idempotency_keys_max: int,
) -> WriteResult:
    """Apply an admitted write: data, audit record, idempotency record. Same transaction."""
    seq = next_seq(conn)
    if write.op == "put":
        conn.execute(
            "INSERT INTO kv (scope, key, value, token_value, commit_seq) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, "
            "token_value = excluded.token_value, commit_seq = excluded.commit_seq",
            (write.scope, write.key, write.value, token_value, seq),
        )
    else:
        conn.execute("DELETE FROM kv WHERE scope = ? AND key = ?", (write.scope, write.key))
    conn.execute(
        "INSERT INTO audit (commit_seq, scope, key, op, token_value, idempotency_key) VALUES (?, ?, ?, ?, ?, ?)",
        (seq, write.scope, write.key, write.op, token_value, write.idempotency_key),
    )
    if seq > audit_records_max:
        pruned_through = seq - audit_records_max
        conn.execute("DELETE FROM audit WHERE commit_seq <= ?", (pruned_through,))
        conn.execute(
            "UPDATE counters SET value = max(value, ?) WHERE name = 'audit_pruned_through'", (pruned_through,)
        )
    if write.idempotency_key is not None:
        _remember(conn, write, token_value, high_water, seq, idempotency_keys_max)
    return WriteResult(write.scope, write.key, token_value, high_water, seq, replayed=False)


def _remember(
    conn: sqlite3.Connection, write: Write, token_value: int, high_water: int, seq: int, keys_max: int
) -> None:
    conn.execute(
        "INSERT INTO idempotency (scope, idempotency_key, fingerprint, key, token_value, high_water, commit_seq) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (write.scope, write.idempotency_key, write.fingerprint(), write.key, token_value, high_water, seq),
    )
    count = conn.execute(
        "UPDATE counters SET value = value + 1 WHERE name = 'idempotency_keys' RETURNING value"
    ).fetchall()[0][0]
    if count <= keys_max:
        return
    # Keep the newest keys: R3 holds within a window of IDEMPOTENCY_KEYS_MAX keys.
    excess = count - keys_max
    pruned = conn.execute(
        "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency ORDER BY commit_seq LIMIT ?)",
        (excess,),
    ).rowcount
    conn.execute("UPDATE counters SET value = value - ? WHERE name = 'idempotency_keys'", (pruned,))
