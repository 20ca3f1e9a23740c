"""The only hand-written twins of the client: how to sleep, wait, spawn and block.

Everything else in `stockade.client` is written once, async, in ``_async/``,
and ``_sync/`` is generated from it by ``scripts/unasync.py`` (a test checks
that the generated files are current). The generator renames ``AsyncIO`` to
``SyncIO``; these two classes give both sides the same vocabulary.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["AsyncIO", "SyncIO"]

T = TypeVar("T")


class AsyncIO:
    """asyncio: tasks for background work, worker threads for blocking calls."""

    @staticmethod
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    @staticmethod
    def event() -> asyncio.Event:
        return asyncio.Event()

    @staticmethod
    async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout_s`` passes; True if set."""
        if event.is_set():
            return True
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        return event.is_set()

    @staticmethod
    def spawn(function: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(function(), name=name)  # type: ignore[arg-type]

    @staticmethod
    async def join(handle: asyncio.Task[None]) -> None:
        if handle is not asyncio.current_task():
            await asyncio.gather(handle, return_exceptions=True)

    @staticmethod
    async def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(function, *args, **kwargs)


class SyncIO:
    """Threads: a daemon thread for background work; blocking calls run in place."""

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    @staticmethod
    def event() -> threading.Event:
        return threading.Event()

    @staticmethod
    def wait_event(event: threading.Event, timeout_s: float | None) -> bool:
        return event.wait(timeout_s)

    @staticmethod
    def spawn(function: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=function, name=name, daemon=True)
        thread.start()
        return thread

    @staticmethod
    def join(handle: threading.Thread) -> None:
        if handle is not threading.current_thread():
            handle.join()

    @staticmethod
    def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return function(*args, **kwargs)
