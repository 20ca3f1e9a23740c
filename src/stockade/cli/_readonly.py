"""Reading the coordinator and store files without writing or creating anything (``status``, ``history``).

`status` must work where the data directory cannot be written: a read-only
mount, a directory the user may only read, a full disk. Opening the files the
normal way writes (the ``.lock`` claim file, the WAL switch, the boot-id check
and the restart rule), so `status` reads them here instead:

- If the file's ``-wal`` and ``-shm`` both exist (a process has it open, or
  one crashed), it is opened with SQLite's ``mode=ro``: a read-only
  connection that still sees the live WAL and takes the shared read lock, and
  creates no file because both already exist.
- Otherwise (no WAL: every change is in the main file, or the directory does
  not let SQLite use the WAL) it is opened with ``immutable=1``: no lock, no
  side file. A change committed at the same moment can make that read fail;
  it is retried once. A ``-wal`` that exists but cannot be read this way is
  reported as such: what is shown then is the last checkpointed state.

The rows are read in one read transaction per file, and the coordinator's
leases are judged by the same rules the coordinator applies (including the
restart rule when the host rebooted since the file was last opened). A
server's acknowledged changes not yet folded into its file are in the record
log beside it (``coord.log``, `stockade.coordinators.sqlite._log`): its valid
frames of the file's generation are read too and laid over the rows (and over
the history, numbered as their fold will number them). A fold that commits
between the two reads is seen (the log is of a later generation) and the read
is made again.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from stockade.coordinators import sqlite as coordinator_files
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.sqlite import _journal as journal
from stockade.coordinators.sqlite import _log as record_log
from stockade.coordinators.sqlite._rows import load_record
from stockade.core import leases as rules
from stockade.core.errors import BackendUnavailable
from stockade.core.journal import HISTORY_PER_SCOPE, events_of
from stockade.core.tokens import FencingToken
from stockade.resources.store import _sqlite_files as store_files

__all__ = ["CoordinatorSnapshot", "read_coordinator", "read_contenders", "read_scope", "read_high_waters",
           "read_history", "check_store_file"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CoordinatorSnapshot:
    cluster_id: str
    scopes: list[rules.ScopeInfo]
    note: str | None  # set when the live WAL could not be read


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


class RaceWithFold(Exception):
    """A fold of the server's record log into the file raced a read: read again."""


def _read(path: Path, what: str, body: Callable[[sqlite3.Connection], T]) -> tuple[T, str | None]:
    """``body(conn)`` on a read-only connection to ``path``, in one read transaction; again if a fold of the
    server's record log raced it (`RaceWithFold`: a fold is a few ms, and comes every few thousand changes)."""
    for _ in range(record_log.FOLD_RACE_RETRIES):
        try:
            return _read_once(path, what, body)
        except RaceWithFold:
            continue
    raise BackendUnavailable(f"{path}: its record log {record_log.log_path(path).name} kept being folded into the "
                             "file while it was read, or is of a later generation than the file (an older copy of "
                             "the file restored? the next server start moves the log aside)")


def _read_once(path: Path, what: str, body: Callable[[sqlite3.Connection], T]) -> tuple[T, str | None]:
    if not path.is_file():
        raise BackendUnavailable(f"{path} is not a file")
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    uri = "file:" + quote("/" + str(path.absolute()).lstrip("/"))  # "file://x/..." would name a host x
    attempts: list[tuple[str, str | None]] = []
    if wal.exists() and shm.exists():
        attempts.append(("mode=ro", None))
    stale: str | None = None
    if wal.exists() and wal.stat().st_size > 0:
        stale = f"{wal} could not be read; showing {path.name} as last checkpointed"
    attempts += [("immutable=1", stale), ("immutable=1", stale)]  # once more if a checkpoint raced the read
    error: Exception | None = None
    for i, (mode, note) in enumerate(attempts):
        try:
            conn = sqlite3.connect(f"{uri}?{mode}", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            error = exc
            continue
        try:
            conn.execute("BEGIN")
            generation = record_log.read_generation(conn)  # the snapshot the body reads
            result = body(conn)
            conn.execute("ROLLBACK")
            if record_log.generation_moved(conn, generation):  # a fold may have torn the log read: read again
                raise RaceWithFold(str(path))
            return result, note
        except sqlite3.Error as exc:
            error = exc
            if i + 1 < len(attempts) and attempts[i + 1][0] == mode:
                time.sleep(0.05)
        finally:
            conn.close()
    raise BackendUnavailable(f"cannot read the {what} file {path}: {error}")


def _coordinator_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    if "cluster_id" not in meta or meta.get("schema_version") not in ("1", "2", coordinator_files.SCHEMA_VERSION):
        raise BackendUnavailable(
            f"{path}: not a stockade coordinator file of schema version {coordinator_files.SCHEMA_VERSION}"
        )
    return meta


def _store_meta(conn: sqlite3.Connection, path: Path) -> None:
    meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    if meta.get("kind") != store_files.STORE_KIND or meta.get("schema_version") != store_files.SCHEMA_VERSION:
        raise BackendUnavailable(f"{path}: not a stockade store file of schema version {store_files.SCHEMA_VERSION}")


def read_history(path: Path, scope: str, limit: int) -> tuple[list[HistoryEvent], str | None]:
    """The scope's last ``limit`` lease events in the coordinator file at ``path``, read-only, oldest first.

    Raises:
        BackendUnavailable: not a readable coordinator file of a supported version.
    """

    def body(conn: sqlite3.Connection) -> list[HistoryEvent]:
        cluster = _coordinator_meta(conn, path)["cluster_id"]
        events = journal.read_history(conn, scope, limit)
        logged = _logged(conn, path, cluster, None)
        if not logged:
            return events
        # The log's changes, numbered on from the file's last event as their fold will number them.
        seq = journal.last_seq(conn)
        stored = {name: load_record(conn, cluster, name) for name in {name for name, _, _ in logged}}
        for old, new, at_ms in record_log.overlay_records(stored, logged):
            for kind, holder, token in events_of(old, new):
                seq += 1
                if old.scope == scope:
                    events.append(HistoryEvent(seq, scope, kind, holder, token, at_ms))
        return events[-min(limit, HISTORY_PER_SCOPE):]

    return _read(path, "coordinator", body)


def check_store_file(path: Path) -> None:
    """Raise `BackendUnavailable` unless ``path`` is a readable stockade store file of a supported version."""
    _read(path, "store", lambda conn: _store_meta(conn, path))


def _records(conn: sqlite3.Connection, path: Path, now_ns: int, limit: int,
             scope: str | None = None) -> tuple[str, list[rules.ScopeRecord]]:
    """The cluster id and the first ``limit`` scope records (only ``scope``'s, when given), as the
    coordinator would judge them now (the restart rule applied when the host rebooted since)."""
    meta = _coordinator_meta(conn, path)
    cluster = meta["cluster_id"]
    rebooted = meta.get("boot_id") != _boot_id()
    where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
    held = "leases WHERE 1" if meta["schema_version"] == "1" else "scopes WHERE lease_id IS NOT NULL"
    leases = {
        row[0]: rules.Lease(row[1], row[2], FencingToken(cluster, row[0], row[3]), *row[4:])
        for row in conn.execute(  # version 1 kept leases in a table of their own (read as it is, never migrated)
            "SELECT scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns FROM " + held
            + (" AND scope = ?" if scope is not None else ""), args
        )
    }
    waiters: dict[str, list[rules.Waiter]] = {}
    for name, *waiter in conn.execute(
        f"SELECT scope, lease_id, holder, deadline_ns, stale_ns FROM waiters {where} ORDER BY scope, seq", args
    ):
        waiters.setdefault(name, []).append(rules.Waiter(*waiter))
    logged = _logged(conn, path, cluster, scope)
    stored = {}
    for name, last_token, delay_until_ns in conn.execute(
        f"SELECT scope, last_token, delay_until_ns FROM scopes {where} ORDER BY scope LIMIT ?",
        (*args, limit + len(logged)),  # room for the scopes the log forgets
    ):
        stored[name] = rules.ScopeRecord(
            name, last_token=last_token, lease=leases.get(name), delay_until_ns=delay_until_ns,
            waiters=tuple(waiters.get(name, ())),
        )
    if logged:  # the server's acknowledged changes still only in its record log (`_log`), on the file's clock
        unread = {change[0] for change in logged} - stored.keys()  # each once, however often the log changed it
        stored.update({name: load_record(conn, cluster, name) for name in unread})
        record_log.overlay_records(stored, logged)
    records = [stored[name] for name in sorted(stored)[:limit]]
    if rebooted:  # what the next opener will do (C3): the stored times are on a clock that is gone
        records = [rules.recover(record, now_ns, rules.LeasePolicy(), same_clock=False) for record in records]
    return cluster, records


def _logged(conn: sqlite3.Connection, path: Path, cluster: str,
            scope: str | None) -> list[tuple[str, rules.ScopeRecord | None, int]]:
    """The record log's changes beyond the file as read (only ``scope``'s, when given); `RaceWithFold` if a fold
    of the log into the file raced the read."""
    changes, raced = record_log.logged_changes(conn, path, cluster)
    if raced:
        raise RaceWithFold(str(path))
    return [change for change in changes if scope is None or change[0] == scope]


def read_coordinator(path: Path, now_ns: int, limit: int) -> CoordinatorSnapshot:
    """The first ``limit`` scopes of the coordinator file at ``path``, as ``status`` shows it, read-only.

    Raises:
        BackendUnavailable: not a readable coordinator file of a supported version.
    """
    (cluster, records), note = _read(path, "coordinator", lambda conn: _records(conn, path, now_ns, limit))
    return CoordinatorSnapshot(cluster, [rules.describe(r, now_ns, rules.LeasePolicy()) for r in records], note)


def read_contenders(path: Path, now_ns: int, scope: str, limit: int) -> tuple[list[rules.Contender], str | None]:
    """Who holds ``scope`` and who waits for it in the coordinator file at ``path``, in serving order, read-only.

    Raises:
        BackendUnavailable: not a readable coordinator file of a supported version.
    """
    (_, records), note = _read(path, "coordinator", lambda conn: _records(conn, path, now_ns, 1, scope))
    return (rules.contenders_of(records[0], now_ns, rules.LeasePolicy(), limit) if records else []), note


def read_scope(path: Path, now_ns: int, scope: str) -> tuple[rules.ScopeInfo | None, str | None]:
    """``scope``'s state in the coordinator file at ``path`` (None: no record of it), read-only, by its name:
    one lookup, however many scopes the file holds.

    Raises:
        BackendUnavailable: not a readable coordinator file of a supported version.
    """
    (_, records), note = _read(path, "coordinator", lambda conn: _records(conn, path, now_ns, 1, scope))
    return (rules.describe(records[0], now_ns, rules.LeasePolicy()) if records else None), note


def read_high_waters(path: Path) -> tuple[dict[str, int], str | None]:
    """Every scope's high-water mark in the store file at ``path``, read-only.

    Raises:
        BackendUnavailable: not a readable store file of a supported version.
    """

    def body(conn: sqlite3.Connection) -> dict[str, int]:
        _store_meta(conn, path)
        return dict(conn.execute("SELECT scope, high_water FROM hwm ORDER BY scope").fetchall())

    return _read(path, "store", body)
