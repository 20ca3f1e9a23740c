"""Opening coordinators and stores by url."""

from __future__ import annotations

from stockade.client._async._embedded import AsyncEmbeddedCoordinatorPort, AsyncEmbeddedStorePort
from stockade.client._async.coordinator import AsyncCoordinator
from stockade.client._async.store import AsyncFencedStore
from stockade.client._shared import sqlite_path
from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.leases import LeasePolicy
from stockade.resources.store import SQLiteStore

__all__ = ["connect_async", "open_store_async"]


def connect_async(url: str, *, lock_delay_ms: int = 0) -> AsyncCoordinator:
    """Open a coordinator.

    Args:
        url: ``sqlite:///path/to/coord.db`` (created, with a new cluster id, if missing).
        lock_delay_ms: after an *expiry*, keep the scope ungrantable this long (C5).

    Raises:
        InvalidArgument: unknown url or option.
        BackendUnavailable: the coordinator cannot be opened.
    """
    path = sqlite_path(url)
    engine = SQLiteCoordinator(path, policy=LeasePolicy(lock_delay_ms=lock_delay_ms))
    return AsyncCoordinator(AsyncEmbeddedCoordinatorPort(engine))


def open_store_async(url: str, *, cluster_id: str | None = None) -> AsyncFencedStore:
    """Open a fenced store.

    Args:
        url: ``sqlite:///path/to/store.db``.
        cluster_id: the coordinator cluster whose tokens the store accepts
            (``coord.cluster_id``). Required when the store is created;
            checked against the store's own when given for an existing one.
    """
    path = sqlite_path(url)
    return AsyncFencedStore(AsyncEmbeddedStorePort(SQLiteStore(path, cluster_id=cluster_id)))
