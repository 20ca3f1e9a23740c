"""The client: leases with keepalive, and a fenced store whose writes carry the token.

Written once in ``_async/``; ``_sync/`` is generated from it (scripts/unasync.py).
"""

from stockade.client._async.connect import connect_async, open_store_async
from stockade.client._async.coordinator import AsyncCoordinator, AsyncLease
from stockade.client._async.election import AsyncLeadership
from stockade.client._async.rwlock import AsyncReadLease, AsyncReadWriteLock
from stockade.client._async.semaphore import AsyncSemaphore
from stockade.client._async.store import AsyncFencedStore
from stockade.client._hooks import Hooks
from stockade.client._leader import LeaderInfo
from stockade.client._sync.connect import connect, open_store
from stockade.client._sync.coordinator import Coordinator, Lease
from stockade.client._sync.election import Leadership
from stockade.client._sync.rwlock import ReadLease, ReadWriteLock
from stockade.client._sync.semaphore import Semaphore
from stockade.client._sync.store import FencedStore

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
