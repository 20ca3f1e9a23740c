"""The fenced store's public names, where README and users have always imported them.

The store itself now lives in parts, each a module of its own:

- `stockade.core.values`: `WriteResult`, `Item`, `AuditRecord`, `BackupInfo`, `RestoreReport`.
- `stockade.resources.store.sqlite_store`: `SQLiteStore`, `BatchWrite`, and the store's bounds.
- `stockade.resources._tx`: `Tx`, the steps of a transaction (the same for every adapter).
- `stockade.resources.store.backup`: `restore` (and the copy behind `SQLiteStore.backup`).
- `stockade.resources._inputs`: `coerce_token`.

Importing from here keeps working; new code may import from either place.

Three things are called "store"; this is stockade's own fenced key-value store (SQLite or memory).
The others: the client's handle over any store (`FencedStore`, module ``client/_async/store.py``) and
the conformance suite every store adapter passes (`stockade.testing.conformance.store`).
"""

from __future__ import annotations

from stockade.core.values import AuditRecord, BackupInfo, Item, RestoreReport, WriteResult
from stockade.resources._inputs import coerce_token
from stockade.resources._tx import Tx
from stockade.resources.store.backup import RESTORE_BUSY_TIMEOUT_MS, restore
from stockade.resources.store.sqlite_store import (
    AUDIT_RECORDS_MAX,
    BUSY_TIMEOUT_MS_DEFAULT,
    BUSY_TIMEOUT_MS_MAX,
    IDEMPOTENCY_KEYS_MAX,
    SCOPES_MAX,
    TX_WRITES_MAX,
    VALUE_BYTES_CEILING,
    BatchWrite,
    SQLiteStore,
)

__all__ = [
    "SQLiteStore",
    "BatchWrite",
    "Tx",
    "WriteResult",
    "Item",
    "AuditRecord",
    "BackupInfo",
    "RestoreReport",
    "restore",
    "coerce_token",
    "AUDIT_RECORDS_MAX",
    "IDEMPOTENCY_KEYS_MAX",
    "SCOPES_MAX",
    "TX_WRITES_MAX",
    "VALUE_BYTES_CEILING",
    "BUSY_TIMEOUT_MS_DEFAULT",
    "BUSY_TIMEOUT_MS_MAX",
    "RESTORE_BUSY_TIMEOUT_MS",
]
