"""The writes that turn one stored scope record into the next, for the SQL record stores.

The SQLite file (`stockade.coordinators.sqlite._rows`) and the PostgreSQL
tables (`stockade.coordinators.postgres._rows`) keep a scope's record in
the same three tables (the scope row, its lease, its queue); only the table
names and the placeholder differ (a `Dialect`). This module says once which
statements a change of record needs for the lease and the queue; each store
writes the scope row itself, since that write is its compare-and-set on
``last_token`` (C1) and each store checks it its own way.
"""

from __future__ import annotations

from dataclasses import dataclass

from stockade.core.errors import invariant
from stockade.core.leases import ScopeRecord

__all__ = ["Dialect", "SQLITE", "POSTGRES", "Statement", "check_change", "scope_row_changed", "lease_and_queue"]

Statement = tuple[str, tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one store spells its tables and parameters.

    Attributes:
        prefix: prepended to ``scopes``, ``leases`` and ``waiters``.
        param: the driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg).
    """

    prefix: str
    param: str

    def sql(self, template: str) -> str:
        """``template`` with ``{t}`` as the table prefix and ``{p}`` as the placeholder."""
        return template.replace("{t}", self.prefix).replace("{p}", self.param)


SQLITE = Dialect("", "?")
POSTGRES = Dialect("stockade_coord_", "%s")


def check_change(old: ScopeRecord, new: ScopeRecord) -> None:
    """Refuse a change that would lower the scope's last token (C1)."""
    # The messages are built only on a violation: this runs on every committed change.
    if new.scope != old.scope:
        invariant(False, f"a record of {old.scope!r} replaced by one of {new.scope!r}")
    if new.last_token < old.last_token:
        invariant(False, f"last_token went back in {new.scope!r}")


def scope_row_changed(old: ScopeRecord, new: ScopeRecord) -> bool:
    """Whether the scope row must be written (its values changed, or it may not exist yet)."""
    return (new.last_token, new.delay_until_ns) != (old.last_token, old.delay_until_ns) or old.last_token == 0


def lease_and_queue(old: ScopeRecord, new: ScopeRecord, dialect: Dialect) -> list[Statement]:
    """The statements that replace ``old``'s lease and queue by ``new``'s, in order."""
    scope = new.scope
    out: list[Statement] = []
    if new.lease != old.lease:
        if old.lease is not None:
            out.append((dialect.sql("DELETE FROM {t}leases WHERE scope = {p}"), (scope,)))
        if new.lease is not None:
            lease = new.lease
            out.append((
                dialect.sql("INSERT INTO {t}leases (scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns) "
                            "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})"),
                (scope, lease.lease_id, lease.holder, lease.token.value, lease.ttl_ms, lease.granted_ns,
                 lease.expires_ns),
            ))
    if new.waiters != old.waiters:
        old_by_id = {w.lease_id: w for w in old.waiters}
        new_ids = {w.lease_id for w in new.waiters}
        for w in old.waiters:
            if w.lease_id not in new_ids:
                out.append((dialect.sql("DELETE FROM {t}waiters WHERE lease_id = {p}"), (w.lease_id,)))
        for w in new.waiters:
            before = old_by_id.get(w.lease_id)
            if before is None:  # a new waiter goes to the back of the queue
                out.append((
                    dialect.sql("INSERT INTO {t}waiters (scope, seq, lease_id, holder, deadline_ns, stale_ns) "
                                "VALUES ({p}, (SELECT COALESCE(MAX(seq), 0) + 1 FROM {t}waiters WHERE scope = {p}), "
                                "{p}, {p}, {p}, {p})"),
                    (scope, scope, w.lease_id, w.holder, w.deadline_ns, w.stale_ns),
                ))
            elif before != w:
                out.append((dialect.sql("UPDATE {t}waiters SET stale_ns = {p} WHERE lease_id = {p}"),
                            (w.stale_ns, w.lease_id)))
    return out
