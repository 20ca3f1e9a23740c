"""Backup and restore of the SQLite store (R4: a restore never rolls a high-water mark back).

`backup` copies a live store with the SQLite backup API into one consistent,
self-contained file. `restore` is the offline opposite: it puts a backup in
place of a store and sets every scope's mark to at least its *fence floor*
(the coordinator's last issued token), its mark in the backup and its mark in
the old store, so that holders from before the restore are fenced out and no
mark goes down. The floors must cover every scope (`FenceFloors`: named
scopes, and a default for all others that the restored file keeps). It
continues ``commit_seq`` after the old store's, and writes a JSON report of
the scopes it raised and the acknowledged writes it removed before it
replaces anything, so a crash never leaves a silent rollback.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument, invariant
from stockade.core.limits import LIST_PAGE_MAX
from stockade.core.values import AuditRecord, BackupInfo, FenceFloors, RestoreReport
from stockade.resources._inputs import BUSY_TIMEOUT_MS_DEFAULT
from stockade.resources.store._sqlite_files import (
    audit_after,
    connect,
    copy_database,
    counter,
    create_private,
    default_floor,
    fsync_path,
    inspect_file,
    read_meta,
    remove_database,
    remove_side_files,
    rollback,
)

__all__ = ["backup", "restore", "complete_floors", "REPORT_FORMAT", "RESTORE_BUSY_TIMEOUT_MS"]

REPORT_FORMAT = "stockade-store-restore-report/1"
RESTORE_BUSY_TIMEOUT_MS = 1_000  # how long restore waits for the old store to be idle


def backup(store_path: Path, source: sqlite3.Connection, dest_path: str | os.PathLike[str]) -> BackupInfo:
    """Copy the store at ``store_path``, through its open connection ``source``, to ``dest_path``.

    The caller holds ``source`` for the copy (`stockade.resources.store.sqlite_store.SQLiteStore.backup`
    does). The copy is written to ``dest_path.partial``, fsync'd and renamed, so
    ``dest_path`` is either the old file or a full backup.

    Returns:
        `BackupInfo` with the snapshot's ``commit_seq`` and HWMs (read from the copy).

    Raises:
        InvalidArgument: ``dest_path`` is the store itself.
        BackendUnavailable: the copy failed.
    """
    dest = Path(dest_path)
    if dest.resolve() == store_path.resolve():
        raise InvalidArgument("dest_path", "must not be the store file itself")
    partial = dest.with_name(dest.name + ".partial")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_database(partial)
        copy_database(store_path, partial, source)
        info = inspect_file(partial)
        fsync_path(partial)
        remove_side_files(dest)
        os.replace(partial, dest)
        fsync_path(dest.parent, directory=True)
    except (sqlite3.Error, OSError) as exc:
        raise BackendUnavailable(f"backup to {dest} failed: {exc}") from exc
    return BackupInfo(dest, info.commit_seq, info.high_waters)


def complete_floors(fence_floors: object, floors_complete: bool) -> FenceFloors:
    """The floors a restore may trust: a `FenceFloors`, or a mapping its caller vouches for.

    A plain mapping names only the scopes it names. If the old store is gone,
    a scope created after the backup (or one the coordinator has since
    forgotten) would get no floor and accept a zombie's token, so a mapping is
    taken only with ``floors_complete=True``: "it lists every scope the
    coordinator ever issued a token for". A callable cannot name scopes at all.

    Raises:
        InvalidArgument: anything else (``field == "fence_floors"``), or a bad scope or floor.
    """
    if isinstance(fence_floors, FenceFloors):
        return fence_floors
    if isinstance(fence_floors, Mapping):
        if floors_complete is not True:
            raise InvalidArgument(
                "fence_floors",
                "a plain mapping may miss scopes (created after the backup, or forgotten by the coordinator), "
                "whose marks the restore would then lower: pass FenceFloors(floors, default) "
                "(e.g. coord.fence_floors()), or floors_complete=True if the mapping lists every scope "
                "the coordinator ever issued a token for",
            )
        return FenceFloors(fence_floors, 0)
    raise InvalidArgument(
        "fence_floors",
        f"must be FenceFloors or a complete mapping of scope to token value, got {type(fence_floors).__name__} "
        "(a callable cannot name the scopes created after the backup)",
    )


def restore(
    backup_path: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    *,
    fence_floors: FenceFloors | Mapping[str, int],
    report_path: str | os.PathLike[str],
    floors_complete: bool = False,
) -> RestoreReport:
    """Put a backup in place of a store without lowering any scope's mark, and report what was lost.

    An offline operation: no process may have ``store_path`` open (one that
    does would keep writing to the replaced file).

    Every scope's mark afterwards is the maximum of the backup's mark, the old
    store's mark (when the old store is readable) and its fence floor. Scopes
    that none of them names, including those first written after the
    restore, start at the default floor, which the restored file keeps. So no
    mark goes down, whether or not the old store survived.

    Steps: copy the backup to a temporary file; read the old store (if any) for
    its last ``commit_seq``, marks and the audit records after the backup's
    ``commit_seq``; set the marks as above; continue ``commit_seq`` after the
    greater of the old and the backup's (never reused); write the JSON report
    (before the store is replaced, so a crash never leaves a silent rollback);
    then atomically rename the copy over the store.

    The report lists only removed writes still in the old store's audit trail
    (its newest ``audit_records_max``); ``removed_complete`` says whether that is all.

    Args:
        backup_path: a file written by `SQLiteStore.backup`.
        store_path: the store to replace (may be missing).
        fence_floors: the coordinator's floors for every scope: a `FenceFloors`
            (its last issued token per scope, and a default above every token of
            the scopes it does not list), or a plain mapping with ``floors_complete=True``.
        report_path: where to write the JSON report.
        floors_complete: the caller vouches that a plain mapping lists every
            scope the coordinator ever issued a token for (unlisted scopes get 0).

    Returns:
        The `RestoreReport`: removed writes, the floors applied, every scope raised.

    Raises:
        InvalidArgument: floors that do not cover every scope (a mapping without
            ``floors_complete=True``, a callable); a floor not in 0..2**63-1; the
            backup is not a store; the old store belongs to another cluster;
            paths collide. Nothing changed.
        BackendUnavailable: I/O failed, or the old store is in use (the old store
            is unchanged unless the final rename happened).
    """
    backup, store, report_file = Path(backup_path), Path(store_path), Path(report_path)
    if backup.resolve() == store.resolve():
        raise InvalidArgument("backup_path", "must differ from store_path")
    if report_file.resolve() in (backup.resolve(), store.resolve()):
        raise InvalidArgument("report_path", "must differ from the backup and the store")
    if not backup.is_file():
        raise InvalidArgument("backup_path", f"{backup} does not exist")
    given = complete_floors(fence_floors, floors_complete)
    staging = store.with_name(store.name + ".restoring")
    try:
        remove_database(staging)
        copy_database(backup, staging)
        backup_info = inspect_file(staging)
        old = _read_old_store(store, backup_info.commit_seq)
        if old.get("cluster_id") not in (None, backup_info.cluster_id):
            raise InvalidArgument(
                "backup_path", f"backup is of cluster {backup_info.cluster_id}, the store of {old['cluster_id']}"
            )
        old_high_waters: dict[str, int] = old.pop("high_waters", {})
        old_default: int = old.pop("default_floor", 0)
        scopes = sorted(set(backup_info.high_waters) | set(old_high_waters) | set(given.floors))
        floors = {scope: given.floor(scope) for scope in scopes}
        backup_marks = {s: backup_info.high_waters.get(s, backup_info.default_floor) for s in scopes}
        old_marks = {s: old_high_waters.get(s, old_default) for s in scopes}
        after = {s: max(backup_marks[s], old_marks[s], floors[s]) for s in scopes}
        default_after = max(given.default, backup_info.default_floor, old_default)
        # Never lower a mark (R4): every scope is named above or falls under the default floor.
        lowered = [s for s in scopes if after[s] < old_marks[s]] + (["*"] if default_after < old_default else [])
        invariant(not lowered, f"restore would lower the marks of {lowered}")
        raised = {s: (backup_marks[s], after[s]) for s in scopes if after[s] > backup_marks[s]}
        next_seq_base = max(backup_info.commit_seq, old.get("commit_seq", 0))
        _apply_restore(staging, after, default_after, next_seq_base)
        removed = [AuditRecord(**r) for r in old.pop("removed", [])]
        report = {
            "format": REPORT_FORMAT,
            "store_path": str(store),
            "backup_path": str(backup),
            "cluster_id": backup_info.cluster_id,
            "backup_commit_seq": backup_info.commit_seq,
            "old_store": old,
            "removed": [asdict(r) for r in removed],
            "removed_complete": old.pop("removed_complete"),
            "fence_floors": floors,
            "default_floor": default_after,
            "high_waters_backup": dict(sorted(backup_info.high_waters.items())),
            "high_waters_old": dict(sorted(old_high_waters.items())),
            "high_waters_after": after,
            "raised": {s: {"backup": b, "after": a} for s, (b, a) in raised.items()},
            "commit_seq_after": next_seq_base,
        }
        _write_json_atomically(report_file, report)
        fsync_path(staging)
        # The old WAL was checkpointed when read; left in place it would be replayed into the new file.
        remove_side_files(store)
        os.replace(staging, store)
        fsync_path(store.parent, directory=True)
    except (sqlite3.Error, OSError) as exc:
        raise BackendUnavailable(f"restore of {store} from {backup} failed: {exc}") from exc
    finally:
        remove_database(staging)
    return RestoreReport(
        removed=removed, fence_floors=floors, report_path=report_file, raised=raised,
        default_floor=default_after, old_store=old["state"],
    )


def _read_old_store(store: Path, backup_seq: int) -> dict[str, Any]:
    """What the store being replaced knows: cluster, last seq, HWMs, writes after ``backup_seq``."""
    if not store.exists():
        return {"state": "missing", "removed_complete": False,
                "note": "old store file missing: removed writes unknown; commit_seq continues after the backup's"}
    try:
        # A short busy wait: a store that stays locked is in use, and restore is offline.
        conn = sqlite3.connect(str(store), isolation_level=None, timeout=RESTORE_BUSY_TIMEOUT_MS / 1000)
        try:
            # Fold the WAL into the main file first: restore deletes the WAL later. A busy
            # checkpoint means someone is using the store, and restore is offline.
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
            if busy:
                raise BackendUnavailable(f"{store} is in use; close it everywhere before restoring",
                                         certain_no_effect=True)
            meta = read_meta(conn, store)
            seq = counter(conn, "commit_seq")
            pruned_through = counter(conn, "audit_pruned_through")
            removed: list[dict[str, Any]] = []
            cursor = backup_seq
            while True:  # bounded: the audit trail holds at most AUDIT_RECORDS_MAX rows
                page = audit_after(conn, None, cursor, LIST_PAGE_MAX)
                removed.extend(asdict(r) for r in page)
                if len(page) < LIST_PAGE_MAX:
                    break
                cursor = page[-1].commit_seq
            high_waters = dict(conn.execute("SELECT scope, high_water FROM hwm").fetchall())
            floor = default_floor(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        # Corrupt or unreadable (a reason to restore). A file that is readable but
        # not a store raised InvalidArgument above: never replace someone else's file.
        return {"state": "unreadable", "error": str(exc), "removed_complete": False,
                "note": "old store unreadable: removed writes unknown; commit_seq continues after the backup's"}
    return {
        "state": "present",
        "cluster_id": meta["cluster_id"],
        "commit_seq": seq,
        "audit_pruned_through": pruned_through,
        "removed_complete": pruned_through <= backup_seq,
        "removed": removed,
        "high_waters": high_waters,
        "default_floor": floor,
    }


def _apply_restore(staging: Path, high_waters: dict[str, int], floor: int, seq_base: int) -> None:
    conn = connect(staging, BUSY_TIMEOUT_MS_DEFAULT)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO hwm (scope, high_water) VALUES (?, ?) "
            "ON CONFLICT (scope) DO UPDATE SET high_water = max(high_water, excluded.high_water)",
            list(high_waters.items()),
        )
        conn.execute(
            "INSERT INTO counters (name, value) VALUES ('default_floor', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)", (floor,),
        )
        # Seqs up to the old store's were used (and are gone with it): never reuse one.
        conn.execute("UPDATE counters SET value = max(value, ?) WHERE name = 'commit_seq'", (seq_base,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except BaseException:
        rollback(conn)
        raise
    finally:
        conn.close()


def _write_json_atomically(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    remove_database(partial)
    create_private(partial)
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    fsync_path(path.parent, directory=True)
