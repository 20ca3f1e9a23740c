"""The ports: what the client's `AsyncCoordinator` and `AsyncFencedStore` call, whatever the backend.

`AsyncEmbeddedCoordinatorPort` serves every in-process lease engine (the
SQLite file, memory); `AsyncHTTPCoordinatorPort` speaks to a `stockade serve`.
A backend with a waiting mechanism of its own (a watch, a notification)
implements this protocol directly. The one conformance suite of the tests
runs on every implementation. `AsyncStorePort` is the store's side:
`AsyncEmbeddedStorePort` over any in-process store, `AsyncHTTPStorePort` over
a server's ``/v1/kv`` and ``/v1/tx``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Protocol

from stockade.client._shared import Grant
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.registry import Capability
from stockade.core.leases import Contender, ScopeInfo
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors, Item, Write, WriteResult

__all__ = ["AsyncCoordinatorPort", "AsyncStorePort"]


class AsyncCoordinatorPort(Protocol):
    """A coordinator as the client sees it.

    Attributes:
        cluster_id: the id every token of this coordinator carries; None until
            `open` has fetched it (a remote coordinator opened inside an event loop).
        capabilities: what the backend guarantees or accepts.
        keys: what a fenced store of this coordinator verifies token MACs with
            (`AsyncCoordinator.verify_keys`); None where the backend has none.
    """

    capabilities: frozenset[Capability]
    #: Requests that waits until granted sent past their first (a server's per-request cap ran out
    #: and the wait went on with its queue ticket); stays 0 on a port that waits in one call.
    wait_rounds: int

    @property
    def cluster_id(self) -> str | None: ...

    @property
    def keys(self) -> object: ...

    async def open(self) -> None:
        """Fetch what the port needs before its first grant (the cluster id); idempotent.

        Raises:
            BackendUnavailable: the backend could not be reached.
        """
        ...

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Acquire ``scope``, waiting in FIFO order up to ``wait_ms`` (C4).

        ``wait_ms=None`` waits until granted, keeping its place in the queue, however
        many requests that takes (a server's per-request cap: the port sends the next
        one with its queue ticket); only a cancellation (or KeyboardInterrupt) ends it,
        and that leaves the queue as a timeout does. `wait_rounds` counts the requests
        past the first such waits made.

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

    async def contenders(self, scope: str, *, limit: int) -> list[Contender]:
        """Who holds ``scope`` and who waits for it, at most ``limit`` (1..`CONTENDERS_MAX`): the holder
        first (none when the scope is free or in its lock-delay), then the waiters in the order they
        will be served (C4). Holder names only: no lease id, no token."""
        ...

    async def last_issued(self, scope: str) -> int:
        """The greatest token value issued for ``scope`` (0 if none): its fence floor."""
        ...

    async def fence_floors(self) -> FenceFloors:
        """The fence floor of every scope at once, for a store's restore (R4)."""
        ...

    async def history(self, scope: str, *, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` lease events from the backend's journal, oldest first (docs/history.md).

        Raises:
            InvalidArgument: the backend keeps no journal.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...


class AsyncStorePort(Protocol):
    """A fenced store as the client's `AsyncFencedStore` sees it.

    Attributes:
        cluster_id: the cluster whose tokens the store trusts; None until `open`
            has fetched it (a remote store opened inside an event loop).
        value_bytes_max: the largest value the store takes.
        tx_bytes_limit: the name of the bound on what one transaction carries
            (raised as `LimitExceeded` before anything is sent).
        tx_bytes_max: that bound, counted in `tx_bytes` of each step.
    """

    value_bytes_max: int
    tx_bytes_limit: str
    tx_bytes_max: int

    @property
    def cluster_id(self) -> str | None: ...

    async def open(self) -> None:
        """Fetch what the port needs (the cluster id); idempotent."""
        ...

    async def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken, idempotency_key: str | None
    ) -> WriteResult: ...

    async def delete(
        self, scope: str, key: str, *, token: FencingToken, idempotency_key: str | None
    ) -> WriteResult: ...

    async def get(self, scope: str, key: str) -> Item | None: ...

    async def list(self, scope: str, *, after: str, limit: int) -> list[Item]: ...

    async def high_water(self, scope: str) -> int: ...

    def tx_bytes(self, write: Write) -> int:
        """What one validated step adds up to against `tx_bytes_max` (pure; no I/O)."""
        ...

    async def transaction(
        self, scope: str, writes: Sequence[Write], *, token: FencingToken
    ) -> builtins.list[WriteResult]:
        """Apply ``writes`` (validated, of ``scope``, in order) all or none, in one call that checks
        ``token`` against the scope's high-water mark in the same commit (R1, R6).

        Returns:
            Every step's committed result, in order.

        Raises:
            StaleToken: a newer token wrote to the scope first. Nothing applied.
            TokenMismatch: a token of another scope or cluster, or forged. Nothing applied.
            InvalidArgument, LimitExceeded: nothing applied.
            BackendUnavailable: the store failed; see ``certain_no_effect``.
        """
        ...

    async def aclose(self) -> None: ...
