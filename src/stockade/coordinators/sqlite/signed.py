"""Opening the SQLite coordinator by url: its file, and the keyring beside it that signs its tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.engine import LeaseEngine
from stockade.core.leases import LeasePolicy
from stockade.keys import KeyFile, create_keyring, keyring_path
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["open_signed_sqlite", "open_engine"]


def open_signed_sqlite(path: Path, policy: LeasePolicy, **options: Any) -> SQLiteCoordinator:
    """A `SQLiteCoordinator` that signs its tokens with the keyring next to its file (created with it).

    ``dir/coord.db`` signs with ``dir/coord.keys`` (`stockade.keys`; docs/tokens.md).

    Raises:
        BackendUnavailable: the keyring cannot be created or read, or is another cluster's.
    """
    coordinator = SQLiteCoordinator(path, policy=policy, **options)
    try:
        keyring = create_keyring(keyring_path(path), coordinator.cluster_id)
        coordinator.signer = KeyFile(keyring_path(path), keyring.cluster_id)
    except BaseException:
        coordinator.close()
        raise
    return coordinator


def open_engine(location: str, policy: LeasePolicy) -> LeaseEngine:
    """The ``sqlite://`` entry of `stockade.coordinators.registry`: ``location`` is what follows ``sqlite://``
    (``/relative/coord.db`` or ``//absolute/coord.db``, `stockade.transport.sqlite_url`)."""
    return open_signed_sqlite(sqlite_path(location), policy)
