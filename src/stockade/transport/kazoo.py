"""Waiting for kazoo's answers, blocking or awaited: the ZooKeeper port's hand-written pair.

kazoo answers every request with an ``IAsyncResult`` completed on its own
thread. `ZkBridge` (the sync port) waits on it in place; `AsyncZkBridge` (the
async port) links a callback that hands the outcome to the event loop with
``call_soon_threadsafe``, so no request blocks the loop. The port
(`stockade.coordinators.zookeeper`) is written once against the async bridge
and generated for the sync one; these two classes are the part that cannot be.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from stockade.core.errors import BackendUnavailable

__all__ = ["ZkBridge", "AsyncZkBridge", "ZkWakeup", "AsyncZkWakeup", "KazooSession", "UNREACHABLE"]

#: kazoo's errors that mean "the ensemble could not answer" (outcome unknown).
UNREACHABLE = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError, KazooTimeoutError)


class KazooSession(Protocol):
    """What a bridge needs of a session: its kazoo client, and how long a connect may take."""

    @property
    def client(self) -> Any: ...

    @property
    def connect_timeout_ms(self) -> int: ...


def _unreachable(exc: BaseException) -> BackendUnavailable:
    detail = f": {exc}" if str(exc) else ""  # kazoo's timeouts carry no text
    return BackendUnavailable(f"zookeeper did not answer: {type(exc).__name__}{detail}")


class ZkWakeup:
    """A watch's callback (called on kazoo's thread) and the event it sets."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, *_: Any) -> None:
        self.event.set()


class ZkBridge:
    """Blocking waits on kazoo's answers, in place (the sync client)."""

    def __init__(self, session: KazooSession, timeout_ms: int) -> None:
        self.session = session
        self.timeout_ms = timeout_ms

    def start(self) -> None:
        client = self.session.client
        if client.connected:
            return
        live = client.start_async()
        live.wait(self.session.connect_timeout_ms / 1000)
        if not client.connected:
            client.stop()
            raise BackendUnavailable("no zookeeper server answered in time", certain_no_effect=True)

    def call(self, result: Any) -> Any:
        try:
            return result.get(timeout=self.timeout_ms / 1000)
        except UNREACHABLE as exc:
            raise _unreachable(exc) from None

    def wakeup(self) -> ZkWakeup:
        return ZkWakeup()

    def wait(self, wakeup: ZkWakeup, timeout_s: float) -> None:
        wakeup.event.wait(max(0.0, timeout_s))


class AsyncZkWakeup:
    """A watch's callback (called on kazoo's thread) that sets an asyncio event on its loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def __call__(self, *_: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop closed meanwhile
            pass


def _settle(future: asyncio.Future[Any], outcome: tuple[Any, BaseException | None]) -> None:
    if not future.done():
        if outcome[1] is not None:
            future.set_exception(outcome[1])
        else:
            future.set_result(outcome[0])


class AsyncZkBridge:
    """kazoo's answers as awaitables: a completion callback resolves a future on the loop."""

    def __init__(self, session: KazooSession, timeout_ms: int) -> None:
        self.session = session
        self.timeout_ms = timeout_ms

    async def start(self) -> None:
        client = self.session.client
        if client.connected:
            return
        live = client.start_async()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, live.wait, self.session.connect_timeout_ms / 1000)
        if not client.connected:
            await loop.run_in_executor(None, client.stop)
            raise BackendUnavailable("no zookeeper server answered in time", certain_no_effect=True)

    async def call(self, result: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(finished: Any) -> None:
            try:
                outcome: tuple[Any, BaseException | None] = (finished.get_nowait(), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                outcome = (None, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, outcome)
            except RuntimeError:  # the loop closed meanwhile
                pass

        result.rawlink(done)
        try:
            # Not asyncio.wait_for: on 3.11 it returns the answer and drops a cancellation that arrives with it,
            # and a wait until granted would then never end (tests/test_wait_forever.py).
            async with asyncio.timeout(self.timeout_ms / 1000):
                return await future
        except (TimeoutError, *UNREACHABLE) as exc:
            raise _unreachable(exc) from None

    def wakeup(self) -> AsyncZkWakeup:
        return AsyncZkWakeup()

    async def wait(self, wakeup: AsyncZkWakeup, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):  # keeps a cancellation, as `call` does
                await wakeup.event.wait()
        except TimeoutError:
            pass


