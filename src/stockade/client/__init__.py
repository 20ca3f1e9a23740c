"""The client: leases with keepalive, and a fenced store whose writes carry the token.

Written once in ``_async/``; ``_sync/`` is generated from it (scripts/unasync.py). The async names are
imported on first use (`ASYNC_NAMES`): a process with no event loop never loads them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from stockade.client._hooks import Hooks
from stockade.client._leader import LeaderInfo
from stockade.client._sync.connect import connect, open_store
from stockade.client._sync.coordinator import Coordinator, Lease
from stockade.client._sync.election import Leadership
from stockade.client._sync.rwlock import ReadLease, ReadWriteLock
from stockade.client._sync.semaphore import Semaphore
from stockade.client._sync.store import FencedStore

if TYPE_CHECKING:
    from stockade.client._async.connect import connect_async, open_store_async
    from stockade.client._async.coordinator import AsyncCoordinator, AsyncLease
    from stockade.client._async.election import AsyncLeadership
    from stockade.client._async.rwlock import AsyncReadLease, AsyncReadWriteLock
    from stockade.client._async.semaphore import AsyncSemaphore
    from stockade.client._async.store import AsyncFencedStore

__all__ = [
    "connect",
    "connect_async",
    "open_store",
    "open_store_async",
    "Coordinator",
    "AsyncCoordinator",
    "Lease",
    "AsyncLease",
    "FencedStore",
    "AsyncFencedStore",
    "Hooks",
    "Leadership",
    "AsyncLeadership",
    "LeaderInfo",
    "Semaphore",
    "AsyncSemaphore",
    "ReadWriteLock",
    "AsyncReadWriteLock",
    "ReadLease",
    "AsyncReadLease",
]

#: The async half of the API, by name -> its module: imported on first use, then bound here like the rest.
ASYNC_NAMES = {
    "connect_async": "stockade.client._async.connect",
    "open_store_async": "stockade.client._async.connect",
    "AsyncCoordinator": "stockade.client._async.coordinator",
    "AsyncLease": "stockade.client._async.coordinator",
    "AsyncLeadership": "stockade.client._async.election",
    "AsyncReadLease": "stockade.client._async.rwlock",
    "AsyncReadWriteLock": "stockade.client._async.rwlock",
    "AsyncSemaphore": "stockade.client._async.semaphore",
    "AsyncFencedStore": "stockade.client._async.store",
}


def __getattr__(name: str) -> object:
    module = ASYNC_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *ASYNC_NAMES})
