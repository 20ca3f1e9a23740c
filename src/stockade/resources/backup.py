"""Backup and restore of the SQLite store (R4: a restore never rolls a high-water mark back).

`backup` copies a live store with the SQLite backup API into one consistent,
self-contained file. `restore` is the offline opposite: it puts a backup in
place of a store, raises every scope's mark to a *fence floor* (the
coordinator's last issued token), so that holders from before the restore are
fenced out, continues ``commit_seq`` after the old store's, and writes a JSON
report of the acknowledged writes the restore removed before it replaces
anything, so a crash never leaves a silent rollback.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.limits import LIST_PAGE_MAX, TOKEN_VALUE_MAX, validate_int, validate_scope
from stockade.core.values import AuditRecord, BackupInfo, RestoreReport
from stockade.resources._sqlite_files import (
    BUSY_TIMEOUT_MS_DEFAULT,
    audit_after,
    connect,
    copy_database,
    counter,
    fsync_path,
    inspect_file,
    read_meta,
    remove_database,
    remove_side_files,
    rollback,
)

__all__ = ["backup", "restore", "REPORT_FORMAT", "RESTORE_BUSY_TIMEOUT_MS"]

REPORT_FORMAT = "stockade-store-restore-report/1"
RESTORE_BUSY_TIMEOUT_MS = 1_000  # how long restore waits for the old store to be idle


def backup(store_path: Path, source: sqlite3.Connection, dest_path: str | os.PathLike[str]) -> BackupInfo:
    """Copy the store at ``store_path``, through its open connection ``source``, to ``dest_path``.

    The caller holds ``source`` for the copy (`stockade.resources.sqlite_store.SQLiteStore.backup`
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


def restore(
    backup_path: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    *,
    fence_floors: Callable[[str], int] | Mapping[str, int],
    report_path: str | os.PathLike[str],
) -> RestoreReport:
    """Put a backup in place of a store, with fence floors, and report what was lost.

    An offline operation: no process may have ``store_path`` open (one that
    does would keep writing to the replaced file).

    Steps: copy the backup to a temporary file; read the old store (if any) for
    its last ``commit_seq``, HWMs and the audit records after the backup's
    ``commit_seq``; set each scope's HWM to the maximum of the backup's HWM, the
    fence floor, and the old store's HWM; continue ``commit_seq`` after the
    greater of the old and the backup's (never reused); write the JSON report
    (before the store is replaced, so a crash never leaves a silent rollback);
    then atomically rename the copy over the store.

    Scopes that get a floor: every scope in the backup, every scope of the old
    store, and for a Mapping every scope in it. If the old store is missing,
    scopes created after the backup are known only from a Mapping: pass the
    coordinator's full list (e.g. from ``SQLiteCoordinator.scopes``).

    The report lists only removed writes still in the old store's audit trail
    (its newest ``audit_records_max``); ``removed_complete`` says whether that is all.

    Args:
        backup_path: a file written by `SQLiteStore.backup`.
        store_path: the store to replace (may be missing).
        fence_floors: the coordinator's last issued token per scope, as a
            callable or a mapping (missing scopes: 0).
        report_path: where to write the JSON report.

    Returns:
        The `RestoreReport`.

    Raises:
        InvalidArgument: the backup is not a store; the old store belongs to another
            cluster; a floor is not in 0..2**63-1; paths collide. Nothing changed.
        BackendUnavailable: I/O failed (the old store is unchanged unless the final
            rename happened).
    """
    backup, store, report_file = Path(backup_path), Path(store_path), Path(report_path)
    if backup.resolve() == store.resolve():
        raise InvalidArgument("backup_path", "must differ from store_path")
    if report_file.resolve() in (backup.resolve(), store.resolve()):
        raise InvalidArgument("report_path", "must differ from the backup and the store")
    if not backup.is_file():
        raise InvalidArgument("backup_path", f"{backup} does not exist")
    if not callable(fence_floors) and not isinstance(fence_floors, Mapping):
        raise InvalidArgument("fence_floors", "must be a callable or a mapping of scope to token value")
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
        scopes = set(backup_info.high_waters) | set(old_high_waters)
        if isinstance(fence_floors, Mapping):
            scopes |= {validate_scope(s, "fence_floors") for s in fence_floors}
        floors: dict[str, int] = {}
        for scope in sorted(scopes):
            raw = fence_floors.get(scope, 0) if isinstance(fence_floors, Mapping) else fence_floors(scope)
            floors[scope] = validate_int(f"fence_floors[{scope}]", raw, 0, TOKEN_VALUE_MAX)
        after = {
            s: max(backup_info.high_waters.get(s, 0), floors[s], old_high_waters.get(s, 0)) for s in sorted(scopes)
        }
        next_seq_base = max(backup_info.commit_seq, old.get("commit_seq", 0))
        _apply_restore(staging, after, next_seq_base)
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
            "high_waters_backup": dict(sorted(backup_info.high_waters.items())),
            "high_waters_after": after,
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
    return RestoreReport(removed=removed, fence_floors=floors, report_path=report_file)


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
            removed = []
            cursor = backup_seq
            while True:  # bounded: the audit trail holds at most AUDIT_RECORDS_MAX rows
                page = audit_after(conn, None, cursor, LIST_PAGE_MAX)
                removed.extend(asdict(r) for r in page)
                if len(page) < LIST_PAGE_MAX:
                    break
                cursor = page[-1].commit_seq
            high_waters = dict(conn.execute("SELECT scope, high_water FROM hwm").fetchall())
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
    }


def _apply_restore(staging: Path, high_waters: dict[str, int], seq_base: int) -> None:
    conn = connect(staging, BUSY_TIMEOUT_MS_DEFAULT)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO hwm (scope, high_water) VALUES (?, ?) "
            "ON CONFLICT (scope) DO UPDATE SET high_water = max(high_water, excluded.high_water)",
            list(high_waters.items()),
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
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    fsync_path(path.parent, directory=True)
