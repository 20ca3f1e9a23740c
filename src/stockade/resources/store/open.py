"""Opening stockade's own store by url: the ``sqlite`` line of `stockade.resources.registry`."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from stockade.keys import KeyFile, find_keyring
from stockade.resources._issued import CoordinatorIssued, coordinator_beside
from stockade.resources._verify import TOKENLESS, UNSIGNED
from stockade.resources.registry import StoreOptions
from stockade.resources.store.sqlite_store import SQLiteStore
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["open_store"]


def _cluster_of_file(path: Path) -> str | None:
    """The cluster id an existing store file names (None: no such file, or not readable as one: the
    store's constructor then says what is wrong)."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT v FROM meta WHERE k = 'cluster_id'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return row[0] if row is not None and isinstance(row[0], str) else None


def _keyring_file(keys: object) -> Path | None:
    """The keyring file ``keys`` name (a path or a `KeyFile`), if any: where its coordinator may be beside."""
    if isinstance(keys, KeyFile):
        return keys.path
    if isinstance(keys, (str, os.PathLike)) and keys not in (UNSIGNED, TOKENLESS):
        return Path(keys)
    return None


def open_store(target: str, cluster_id: str | None, options: StoreOptions) -> SQLiteStore:
    """The ``sqlite`` line of `stockade.resources.registry`: a store on the file ``target``.

    With no ``keys``, the one keyring of its cluster in the file's directory (L2: never unsigned); with
    no ``issued``, the coordinator file beside that keyring, when there is one.
    """
    path, keys, issued = sqlite_path(target), options.keys, options.issued
    cluster = cluster_id if cluster_id is not None else _cluster_of_file(path)
    if keys is None and cluster is not None:  # discovery: the one keyring of the cluster beside it, else refuse (L2)
        keys = find_keyring(path.parent, cluster)
    keyring = _keyring_file(keys)
    if issued is None and keyring is not None:
        beside = coordinator_beside(keyring)
        issued = None if beside is None else CoordinatorIssued(beside)
    return SQLiteStore(
        path, cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=keys, issued=issued,
    )
