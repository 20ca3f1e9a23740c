"""The coordinator port: what the client's `AsyncCoordinator` calls, whatever the backend.

`AsyncEmbeddedCoordinatorPort` serves every in-process lease engine (the
SQLite file, memory); `AsyncHTTPCoordinatorPort` speaks to a `stockade serve`.
A backend with a waiting mechanism of its own (a watch, a notification)
implements this protocol directly. The one conformance suite of the tests
runs on every implementation.
"""

from __future__ import annotations

from typing import Protocol

from stockade.client._shared import Grant
from stockade.coordinators.registry import Capability
from stockade.core.leases import ScopeInfo
from stockade.core.values import FenceFloors

__all__ = ["AsyncCoordinatorPort"]


class AsyncCoordinatorPort(Protocol):
    """A coordinator as the client sees it.

    Attributes:
        cluster_id: the id every token of this coordinator carries; None until
            `open` has fetched it (a remote coordinator opened inside an event loop).
        capabilities: what the backend guarantees or accepts.
    """

    capabilities: frozenset[Capability]

    @property
    def cluster_id(self) -> str | None: ...

    async def open(self) -> None:
        """Fetch what the port needs before its first grant (the cluster id); idempotent.

        Raises:
            BackendUnavailable: the backend could not be reached.
        """
        ...

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int) -> Grant:
        """Acquire ``scope``, waiting in FIFO order up to ``wait_ms`` (C4).

        Raises:
            LockTimeout: still held (or others ahead) when ``wait_ms`` ran out;
                the attempt left the queue, and no grant is left behind.
            LimitExceeded, InvalidArgument: nothing changed.
            BackendUnavailable: the backend failed; outcome unknown.
        """
        ...

    async def renew(self, lease_id: str) -> None:
        """Extend the lease by its TTL from now.

        Raises:
            NotHolder: the lease expired, was released, or never existed.
        """
        ...

    async def release(self, lease_id: str) -> bool:
        """Give the lease up; idempotent. True if it was held until now."""
        ...

    async def inspect(self, scope: str) -> ScopeInfo:
        """One scope's state (a never-used scope reads as free with last token 0)."""
        ...

    async def scopes(self, *, after: str, limit: int) -> list[ScopeInfo]:
        """Scopes in name order after ``after``, at most ``limit``."""
        ...

    async def last_issued(self, scope: str) -> int:
        """The greatest token value issued for ``scope`` (0 if none): its fence floor."""
        ...

    async def fence_floors(self) -> FenceFloors:
        """The fence floor of every scope at once, for a store's restore (R4)."""
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...
