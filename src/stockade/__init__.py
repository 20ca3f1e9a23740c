"""stockade: distributed locks made safe with fencing tokens.

A coordinator grants leases, each with a fencing token that strictly increases
per scope; every write carries the token; the resource rejects any write whose
token is lower than the highest it has accepted.

    coord = stockade.connect("sqlite:////var/lib/stockade/coord.db")
    store = stockade.open_store("sqlite:////var/lib/stockade/store.db", cluster_id=coord.cluster_id)
    with coord.lock("reports", ttl_ms=10_000, wait_ms=5_000) as lease:
        store.put("reports", "daily.csv", data, token=lease.token)

This module lists the whole public API once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from stockade.core.errors import (
    BackendUnavailable,
    FenceRejected,
    InvalidArgument,
    InvariantViolation,
    LeaseError,
    LeaseLost,
    LimitExceeded,
    LockTimeout,
    NotHolder,
    StaleToken,
    StockadeError,
    TokenMismatch,
    Unauthorized,
)
from stockade.core.leases import Contender, ScopeInfo, ScopeState
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, WriteResult  # the store's values (`stockade.resources.store` re-exports them)

if TYPE_CHECKING:
    from stockade.client import (
        AsyncCoordinator,
        AsyncFencedStore,
        AsyncLease,
        AsyncReadLease,
        AsyncReadWriteLock,
        AsyncSemaphore,
        Coordinator,
        FencedStore,
        Lease,
        ReadLease,
        ReadWriteLock,
        Semaphore,
        connect,
        connect_async,
        open_store,
        open_store_async,
    )

__version__ = "0.1.0"

# A library logs; the application decides where logs go (R5 records included).
logging.getLogger("stockade").addHandler(logging.NullHandler())

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
    "Semaphore",
    "AsyncSemaphore",
    "ReadWriteLock",
    "AsyncReadWriteLock",
    "ReadLease",
    "AsyncReadLease",
    "FencingToken",
    "ScopeInfo",
    "ScopeState",
    "Contender",
    "Item",
    "WriteResult",
    "StockadeError",
    "InvalidArgument",
    "LimitExceeded",
    "FenceRejected",
    "StaleToken",
    "TokenMismatch",
    "LeaseError",
    "NotHolder",
    "LeaseLost",
    "LockTimeout",
    "Unauthorized",
    "BackendUnavailable",
    "InvariantViolation",
]


# The client's names, imported from `stockade.client` on first use (then bound here like the rest): a process
# that only serves (``stockade serve``, a file's host process) or only runs a tool never loads the client.
_CLIENT = frozenset({
    "connect", "connect_async", "open_store", "open_store_async", "Coordinator", "AsyncCoordinator", "Lease",
    "AsyncLease", "FencedStore", "AsyncFencedStore", "Semaphore", "AsyncSemaphore", "ReadWriteLock",
    "AsyncReadWriteLock", "ReadLease", "AsyncReadLease",
})


def __getattr__(name: str) -> object:
    if name not in _CLIENT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import stockade.client

    value = getattr(stockade.client, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
