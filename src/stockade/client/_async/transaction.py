"""A multi-step fenced write through the client: buffered here, applied all or none in one call (R6).

``async with store.transaction(scope) as tx`` keeps its steps in this
process: ``tx.put`` and ``tx.delete`` validate and buffer, ``await tx.get``
sees the transaction's own steps and reads the store for every other key.
When the block ends normally, the steps go to the store in one call
(`AsyncStorePort.transaction`: the store's own ``transaction`` in process,
one ``POST /v1/tx/{scope}`` over HTTP) that checks the token against the
scope's high-water mark in the same commit that applies them. If a newer
holder wrote to the scope meanwhile, that call raises `StaleToken` and
nothing of the transaction lands. If the block raises, nothing is sent.

Nothing is locked while the block runs, anywhere: a caller paused inside it
stalls no other writer, and only its own commit can fail for it.
"""

from __future__ import annotations

from stockade.client._async.port import AsyncStorePort
from stockade.client._hooks import Hooks, rejected
from stockade.client._shared import resolve_token
from stockade.core.errors import FenceRejected, InvalidArgument, LimitExceeded
from stockade.core.fence import Reject, check_write, raise_for
from stockade.core.limits import TX_WRITES_MAX, validate_key, validate_value
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, Write, WriteResult

__all__ = ["AsyncStoreTransaction", "PENDING_SEQ"]

PENDING_SEQ = 0  # the commit_seq of an item read back from the transaction's own steps (seqs start at 1)


class AsyncStoreTransaction:
    """The steps of one transaction on one scope; use it as ``async with store.transaction(scope) as tx``.

    Attributes:
        scope: the scope of every step.
        token: the token the steps will carry.
        results: after the commit, each step's committed `WriteResult` in
            step order (None before, and after a failed or abandoned block).
    """

    def __init__(self, port: AsyncStorePort, scope: str, token: FencingToken, *, source: object,
                 hooks: Hooks) -> None:
        self.scope = scope
        self.token = token
        self.results: list[WriteResult] | None = None
        self._port = port
        self._source = source  # what the token came from (a lease is checked again before the commit)
        self._hooks = hooks
        self._writes: list[Write] = []
        self._overlay: dict[str, Item | None] = {}  # this transaction's view of the keys it wrote
        self._bytes = 0
        self._state = "new"  # new -> open -> committed | aborted (a step outside "open" is refused)

    async def __aenter__(self) -> AsyncStoreTransaction:
        if self._state != "new":
            raise InvalidArgument("transaction", "a transaction runs one block")
        await self._port.open()
        await self._check_now()
        self._state = "open"
        return self

    async def __aexit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is not None or self._state != "open":
            self._state = "aborted"  # the block raised: nothing was sent, nothing is
            return
        self._state = "aborted"  # until the commit returns: no step may slip in meanwhile
        token = resolve_token(self._source)  # LeaseLost if the lease was lost during the block: nothing sent
        try:
            self.results = await self._port.transaction(self.scope, self._writes, token=token)
        except FenceRejected as error:
            rejected(self._hooks, error)
            raise
        self._state = "committed"

    async def _check_now(self) -> None:
        """Refuse, before the body runs, a token the store would refuse now: judged by the one
        rule (`stockade.core.fence.check_write`) against the mark read now. Only the commit,
        which checks again in the same atomic step as the writes, decides; this read changes
        nothing at the store, so a refusal here is reported to the hooks, not counted there (R5)."""
        token, cluster = self.token, self._port.cluster_id or self.token.cluster
        high_water = await self._port.high_water(self.scope)
        decision = check_write(token, scope=self.scope, cluster=cluster, high_water=high_water,
                               fingerprint=None, recorded=None)
        if isinstance(decision, Reject):
            try:
                raise_for(token, decision, cluster=cluster, scope=self.scope)
            except FenceRejected as error:
                rejected(self._hooks, error)
                raise

    def _step(self, write: Write) -> None:
        if self._state != "open":
            raise InvalidArgument("transaction", f"is {'not open' if self._state == 'new' else 'closed'}")
        if len(self._writes) >= TX_WRITES_MAX:
            raise LimitExceeded("TX_WRITES_MAX", TX_WRITES_MAX)
        size = self._port.tx_bytes(write)
        if self._bytes + size > self._port.tx_bytes_max:
            raise LimitExceeded(self._port.tx_bytes_limit, self._port.tx_bytes_max, "bytes of one transaction")
        self._bytes += size
        self._writes.append(write)
        self._overlay[write.key] = (
            Item(self.scope, write.key, write.value, self.token.value, PENDING_SEQ) if write.op == "put" else None
        )

    def put(self, key: str, value: bytes | str) -> None:
        """Buffer a write of ``value`` at ``key``: seen by later ``get``, applied at the commit.

        Raises:
            InvalidArgument: bad key or value, or the block is not open. Nothing buffered.
            LimitExceeded: `TX_WRITES_MAX` steps already, or the port's byte bound
                (``tx_bytes_limit``) would be passed. Nothing buffered.
        """
        key = validate_key(key)
        data = validate_value(value, self._port.value_bytes_max)
        self._step(Write(self.scope, key, "put", data, None))

    def delete(self, key: str) -> None:
        """Buffer the removal of ``key``. Raises as `put`."""
        self._step(Write(self.scope, validate_key(key), "delete", b"", None))

    async def get(self, key: str) -> Item | None:
        """``key`` as this transaction sees it: its own last step on the key (``commit_seq``
        `PENDING_SEQ`), else what the store holds now."""
        key = validate_key(key)
        if self._state != "open":
            raise InvalidArgument("transaction", "is not open")
        if key in self._overlay:
            return self._overlay[key]
        return await self._port.get(self.scope, key)

    def __repr__(self) -> str:
        return f"<transaction {self.scope!r} {self._state}, {len(self._writes)} steps>"

