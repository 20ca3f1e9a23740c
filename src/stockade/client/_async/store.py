"""The fenced-store client: every write carries a token (K1).

Three things are called "store"; this is the client's handle, `AsyncFencedStore` (its generated
sync twin `FencedStore`), over any store port (`AsyncStorePort`). The others: stockade's own fenced
key-value store, which the handle opens in process for ``sqlite://`` and ``memory://`` urls
(`stockade.resources.store`), and the conformance suite every store adapter passes
(`stockade.testing.conformance.store`).
"""

from __future__ import annotations

from stockade.client._async.port import AsyncStorePort
from stockade.client._async.transaction import AsyncStoreTransaction
from stockade.client._hooks import Hooks, rejected, validate_hooks
from stockade.client._shared import CURRENT_LEASE, Leased, resolve_token
from stockade.core.errors import FenceRejected, InvalidArgument
from stockade.core.limits import LIST_PAGE_MAX, validate_int, validate_key, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, WriteResult
from stockade.transport.io import AsyncHandle

__all__ = ["AsyncFencedStore", "lease_in_context"]


def lease_in_context(scope: str) -> Leased:
    """The lease of the innermost ``lock()`` block on ``scope`` open in this context.

    `lock()` blocks nest as a stack per context (thread or task): each lease
    links to the one it is nested in. The search walks that stack from the
    innermost block out, so a write to an outer block's scope carries the
    outer lease even while an inner block on another scope is open.

    Raises:
        InvalidArgument: no ``lock()`` block on ``scope`` is open in this context.
    """
    lease = CURRENT_LEASE.get()
    while lease is not None:
        if lease.scope == scope:
            return lease
        lease = lease._enclosing
    raise InvalidArgument("token", f"no token given and no lease on {scope!r} held in this context")


def _token_for(scope: str, token: object) -> FencingToken:
    if token is not None:
        return resolve_token(token)
    if not isinstance(scope, str):
        return resolve_token(None)  # the port reports the bad scope; no lease can match it
    return resolve_token(lease_in_context(scope))


class AsyncFencedStore(AsyncHandle):
    """A fenced key-value store. Writes take ``token=`` (a token, its encoded
    string, or a lease); without it, the lease of the innermost enclosing
    ``lock()`` block on the write's scope.

    A rejected write raises `StaleToken` or `TokenMismatch` and changed
    nothing. Never retry it with the same token (K3): re-acquire, read, reconcile.
    Each rejection is reported to ``hooks.on_reject`` first (`stockade.client.Hooks`).
    """

    def __init__(self, port: AsyncStorePort, *, hooks: Hooks | None = None) -> None:
        self._port = port
        self._hooks = validate_hooks(hooks)

    @property
    def cluster_id(self) -> str:
        """The cluster whose tokens the store accepts.

        Raises:
            InvalidArgument: not known yet: a remote store opened inside a running
                event loop tells it on the first ``await`` of the handle.
        """
        cluster_id: str | None = self._port.cluster_id
        if cluster_id is None:
            raise InvalidArgument("cluster_id", "not known yet: await stockade.open_store_async(url) first")
        return cluster_id

    async def _open(self) -> None:
        await self._port.open()  # every call opens first, as the coordinator's do

    async def __aenter__(self) -> AsyncFencedStore:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._port.aclose()

    async def put(
        self, scope: str, key: str, value: bytes | str, *, token: object = None, idempotency_key: str | None = None
    ) -> WriteResult:
        """Write ``value`` at (scope, key) if ``token`` is not stale (R1).

        Raises:
            StaleToken: token < the scope's high-water mark. Nothing changed.
            TokenMismatch: token of another scope or cluster. Nothing changed.
            InvalidArgument: bad scope, key, value or token. Nothing changed.
            LeaseLost: the lease named is known to be lost. Nothing sent.
        """
        token = _token_for(scope, token)
        await self._open()
        try:
            return await self._port.put(scope, key, value, token=token, idempotency_key=idempotency_key)
        except FenceRejected as exc:
            rejected(self._hooks, exc)
            raise

    async def delete(
        self, scope: str, key: str, *, token: object = None, idempotency_key: str | None = None
    ) -> WriteResult:
        """Delete (scope, key) under the fence rule; deleting a missing key still advances the mark."""
        token = _token_for(scope, token)
        await self._open()
        try:
            return await self._port.delete(scope, key, token=token, idempotency_key=idempotency_key)
        except FenceRejected as exc:
            rejected(self._hooks, exc)
            raise

    def transaction(self, scope: str, *, token: object = None) -> AsyncStoreTransaction:
        """A multi-step write on one scope, applied all or none (R6).

        ``async with store.transaction("reports") as tx:``, then in the block
        ``tx.put(k, v)``, ``tx.delete(k2)`` and ``item = await tx.get(k)``.

        When the block begins, the token is judged against the scope's mark
        (a stale one raises before the body runs). The steps are kept in this
        process, and nothing is locked while the body runs. When the block ends
        normally they are applied in one call that checks the token again in
        the same commit: if a newer holder wrote to the scope meanwhile, it
        raises `StaleToken` and none of the steps apply. If the block raises,
        nothing is sent. ``tx.results`` then holds each step's committed
        `WriteResult`, in step order.

        Args:
            scope: the one scope every step writes.
            token: a token, its encoded string, or a lease; None: the lease of the
                innermost enclosing ``lock()`` on ``scope`` (K1).

        Raises:
            StaleToken, TokenMismatch: at the start or at the commit. Nothing applied.
            InvalidArgument: a bad scope, token, key or value (the step is refused).
            LimitExceeded: more than `TX_WRITES_MAX` steps, or more bytes than the
                store takes in one transaction (``TX_BUFFER_BYTES_MAX`` in process,
                ``TX_BODY_BYTES_MAX`` over HTTP), refused at the step, before anything is sent.
            LeaseLost: the lease given (or in context) is known to be lost, at the
                start or at the commit. Nothing sent.
            BackendUnavailable: the store failed; see ``certain_no_effect``.
        """
        validate_scope(scope)
        source = token if token is not None else lease_in_context(scope)
        return AsyncStoreTransaction(self._port, scope, resolve_token(source), source=source, hooks=self._hooks)

    async def get(self, scope: str, key: str) -> Item | None:
        validate_scope(scope)
        validate_key(key)
        await self._open()
        return await self._port.get(scope, key)

    async def list(self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX) -> list[Item]:
        validate_scope(scope)
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        await self._open()
        return await self._port.list(scope, after=after, limit=limit)

    async def high_water(self, scope: str) -> int:
        """The scope's high-water mark: the greatest token value accepted (0 if none)."""
        validate_scope(scope)
        await self._open()
        return await self._port.high_water(scope)
