"""Group commit: many concurrent requests share one transaction and one fsync.

One writer thread per database file owns that file's write connection. The
event loop hands it operations (`GroupCommitter.submit`); the thread takes
every operation queued so far, runs them as one batch (the store's: one
``BEGIN IMMEDIATE`` … ``COMMIT``, in ``apply_batch``, a failed operation taking
only its own slot; the coordinator's: one frame appended to its record log and
one ``fdatasync``, `stockade.coordinators.sqlite._log`), and only after the
batch is on disk (the store's file is in WAL mode with ``synchronous=FULL``)
resolves the operations' futures on the loop. A handler answers only after its
future resolved: nothing is acknowledged before its fsync.

While one batch commits, the next one gathers, so the batch size grows with
the load by itself and a lone request never waits for company. SQLite releases
the GIL while it steps and syncs, so the loop keeps parsing meanwhile.

What one turn of the loop submits skips the hand-off: it gathers, and at the
end of the turn, if the thread has nothing in hand and the turn brought at most
``inline_ops_max`` operations, the loop commits them itself (same ``run_batch``,
one COMMIT and fsync) and resolves their futures only afterwards. What gathers
goes to the thread together even while the thread is busy: put one by one, the
first would wake a thread that has just finished its batch (whose results the
loop has not taken yet) and commit alone. A lone write saves the two thread
wake-ups (about 60–70 µs of a lock cycle here, measured); a turn's several
writes save them too, and the two threads' contention for the GIL (issue 29:
server CPU per lock cycle at 8 client processes 0.78× of the thread's, medians
of 4 runs side by side; cycles/s unchanged, 0.99×). More operations than that,
or any while the thread is busy, go to the thread in submission order, so
batches still commit in submission order and the loop is blocked by at most
one batch of ``inline_ops_max`` operations.

A batch waits ``gather_turns`` (`GATHER_TURNS`: one) more turns of the loop
before it commits: a turn polls the sockets without waiting, so requests that
arrived while the loop handled the turn join the batch instead of waiting
through its fsync for a commit of their own, and a lone request is committed
one poll later (a few µs). At 8 client processes it cut fsyncs from 0.35 to
0.24 a lock cycle and the server's CPU a cycle to 0.90×, for 1.10× the cycles/s
(`benchmarks/serve_ab.py`, 5 runs; docs/coordinator-files.md); two turns did no
better and three worse (fewer fsyncs, each answer later).

The loop never waits on a file lock: with ``try_batch`` (the store's
`try_apply_batch`), a turn's operations are committed on the loop only if the
file's write lock is free at that moment; if another process holds it (a
paused writer, a backup), they go to the thread, which may wait, and the loop
goes on serving every other request.

An operation nobody waits for (`defer`: a release, answered before its commit,
docs/rules.md, C3) does not start a commit of its own: it waits among the
gathered operations and rides with the next one that does (`submit`), in
submission order, or is committed ``lag_ms`` after it was deferred, whichever
comes first. A read (`barrier`) and a stop (`commit_gathered`) commit it at
once. So with one client a lock cycle is one commit, not two: the release
commits with the next grant.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from stockade import metrics
from stockade.server._metrics import COMMIT_SECONDS

__all__ = ["GroupCommitter", "BATCH_OPS_MAX"]

BATCH_OPS_MAX = 512  # operations per transaction; more wait for the next one
INLINE_OPS_MAX = 64  # operations one turn of the loop may commit on the loop itself (the thread idle)
GATHER_TURNS = 1  # more turns of the loop a batch waits for company before it commits
_LAG_EARLY_S = 0.001  # the loop may run a timer up to its clock's resolution early: due within 1 ms is due

Op = TypeVar("Op")

_STOP = object()
_BATCHES = metrics.REGISTRY.counter("stockade_commit_batches_total", "Group-commit transactions (one fsync each).",
                                    ("file",))
_OPS = metrics.REGISTRY.counter("stockade_commit_ops_total", "Operations committed in group-commit batches.",
                                ("file",))
_log = logging.getLogger("stockade.server")



class GroupCommitter(Generic[Op]):
    """A writer thread that commits queued operations in batches.

    Args:
        name: for the thread and the logs.
        run_batch: runs one batch in one transaction and returns one result per
            operation (an error is a result); raising fails the whole batch.
        loop: the event loop whose futures are resolved.
        inline: a turn's operations may be committed on the loop (False: always on the thread).
        inline_ops_max: at most this many operations of one turn are committed on the loop; a turn with more
            hands them to the thread (1: only a lone operation).
        try_batch: commits a batch on the loop only if that needs no waiting on a lock (else returns None).
        lag_ms: a deferred operation (`defer`) is committed at most this long after it was deferred, if no
            other operation took it along before; 0 (the default): `defer` is `submit`.
        gather_turns: more turns of the loop a batch waits before it commits (what arrives meanwhile joins it).
    """

    def __init__(self, name: str, run_batch: Callable[[Sequence[Op]], Sequence[Any]],
                 loop: asyncio.AbstractEventLoop, *, inline: bool = True,
                 try_batch: Callable[[Sequence[Op]], Sequence[Any] | None] | None = None,
                 inline_ops_max: int = INLINE_OPS_MAX, lag_ms: int = 0, gather_turns: int = GATHER_TURNS) -> None:
        self.name = name
        self._series = (name,)  # its label set in the commit counters
        self.inline = inline
        self.inline_ops_max = inline_ops_max
        # Commits a batch only if that needs no waiting on a lock, else returns None (nothing done).
        self.try_batch = try_batch
        self._gathering: list[tuple[Op, asyncio.Future[Any]]] | None = None
        # While the gathered operations are all deferred: when the first of them was (loop time, s); else None
        # (a `_flush` is due at the end of this loop turn, or nothing is gathered).
        self._deferred_since: float | None = None
        # The lag timer (`_on_lag`), if armed. It is not cancelled when a `submit` takes the deferred operations
        # along: it finds nothing due and rests, or waits on for the ones deferred since (a timer a lag, not a
        # timer a release).
        self._lag: asyncio.TimerHandle | None = None
        self.lag_s = lag_ms / 1000
        self._in_thread = 0  # operations handed to the thread and not yet resolved on the loop
        self.gather_turns = gather_turns
        self._turns_left = gather_turns  # of the gathering batch: turns it still waits before `_flush` takes it
        self._run_batch = run_batch
        self._loop = loop
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=f"stockade-commit-{name}", daemon=True)
        self._last: asyncio.Future[Any] | None = None
        # An operation's future -> the futures of the handlers that wait on it (`reply`).
        self._replies: dict[asyncio.Future[Any], list[asyncio.Future[Any]]] = {}
        # An operation's future -> the one callback called in the step that resolves it (`listen`).
        self._listeners: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None]] = {}
        self.batches = 0
        self.ops = 0
        # Called on the loop when a batch, or one operation in it, failed to commit.
        self.on_failure: Callable[[str], None] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Commit what is queued, then end the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def submit(self, op: Op) -> asyncio.Future[Any]:
        """Queue ``op``; the future resolves (on the loop) once its batch is durable."""
        future: asyncio.Future[Any] = self._loop.create_future()
        self._last = future
        if self.inline:  # gathered until the end of the loop's turn, even while the thread is busy (`_flush`)
            gathering = self._gathering
            if gathering is None:
                gathering = self._gathering = []
                self._loop.call_soon(self._flush)
            elif self._deferred_since is not None:  # deferred operations only, so far: they go with this one
                self._deferred_since = None
                self._loop.call_soon(self._flush)
            gathering.append((op, future))
            return future
        self._in_thread += 1
        self._queue.put((op, future))
        return future

    def defer(self, op: Op) -> asyncio.Future[Any]:
        """Queue ``op`` without starting a commit for it: it commits with the next `submit`'s batch, in
        submission order, or ``lag_ms`` from now, whichever comes first. For a change whose answer does not wait
        for it (a release); the future resolves, as `submit`'s, once it is durable."""
        if not self.inline or not self.lag_s:
            return self.submit(op)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._last = future
        gathering = self._gathering
        if gathering is None:
            gathering = self._gathering = []
            since = self._deferred_since = self._loop.time()
            if self._lag is None:
                self._lag = self._loop.call_at(since + self.lag_s, self._on_lag)
        gathering.append((op, future))
        return future

    def _on_lag(self) -> None:
        """The lag timer: commit the deferred operations whose lag has run out; else wait for those deferred
        since the timer was armed, or rest (nothing deferred waits)."""
        self._lag = None
        since = self._deferred_since
        if since is None:
            return
        due = since + self.lag_s
        if self._loop.time() + _LAG_EARLY_S >= due:
            self._flush()
        else:
            self._lag = self._loop.call_at(due, self._on_lag)

    def commit_gathered(self) -> None:
        """Hand what is gathered (deferred operations too) to the thread now: before `stop`, on the loop."""
        if self._lag is not None:
            self._lag.cancel()
            self._lag = None
        self._deferred_since = None
        batch, self._gathering = self._gathering, None
        if batch:
            self._hand_off(batch)

    def reply(self, future: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """A future for one handler waiting on ``future`` (from `submit`): it resolves as ``future`` does.

        What ``asyncio.shield`` gives, one loop turn sooner: it is resolved in the
        same step as ``future`` itself (after the COMMIT), not by a callback of it.
        Cancelling it (the client went away) leaves ``future``, and the write, alone.
        """
        reply: asyncio.Future[Any] = self._loop.create_future()
        if future.done():
            _settle(reply, future)
        else:
            self._replies.setdefault(future, []).append(reply)
        return reply

    def listen(self, future: asyncio.Future[Any], callback: Callable[[asyncio.Future[Any]], None]) -> None:
        """Call ``callback(future)`` once ``future`` (from `submit`) is resolved, in the step that resolves it
        (after the COMMIT, as `reply`, with no future or loop turn of its own); at once if it is done.

        One callback per operation. It must not raise (what it raises is logged).
        """
        if future.done():
            callback(future)
        else:
            self._listeners[future] = callback

    def _flush(self) -> None:
        """End of a loop turn: after `gather_turns` more, commit its operations here (up to `inline_ops_max`), else
        hand them to the thread."""
        if self._turns_left and self._gathering:
            self._turns_left -= 1
            self._loop.call_soon(self._flush)  # the next turn polls the sockets first: what arrived joins the batch
            return
        self._turns_left = self.gather_turns
        batch, self._gathering = self._gathering, None
        self._deferred_since = None
        if not batch:
            return
        if len(batch) > self.inline_ops_max or self._in_thread:
            self._hand_off(batch)
            return
        results, error = self._commit(batch, self.try_batch)
        if results is None and error is None:  # the file is locked by someone else: never wait on the loop
            self._hand_off(batch)
            return
        # Only now, after COMMIT (and its fsync) returned:
        failed = _resolve(batch, results, error, self._replies, self._listeners)
        if failed:
            self._report(results, error)

    def _hand_off(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        """Queue a turn's operations for the thread, in submission order."""
        self._in_thread += len(batch)
        for item in batch:
            self._queue.put(item)

    def _report(self, results: Sequence[Any] | None, error: BaseException | None) -> None:
        """Tell ``on_failure`` about a failed batch, or about its failed operations (`_resolve` counted them)."""
        if self.on_failure is None:
            return
        if error is not None:
            self.on_failure(f"{self.name} batch failed: {error}")
        elif results is not None:
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                self.on_failure(f"{self.name}: {len(failed)} operation(s) failed to commit: {failed[0]}")

    def _commit(
        self, batch: list[tuple[Any, asyncio.Future[Any]]],
        run: Callable[[Sequence[Op]], Sequence[Any] | None] | None = None,
    ) -> tuple[Sequence[Any] | None, BaseException | None]:
        started = time.monotonic()
        try:
            ops = [batch[0][0]] if len(batch) == 1 else [op for op, _ in batch]  # a lone one: no comprehension
            results: Sequence[Any] | None = (run or self._run_batch)(ops)
            error: BaseException | None = None
            if results is None:
                return None, None  # not run: nothing committed, nothing counted
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiting handler
            results, error = None, exc
            _log.error("%s batch of %d failed: %s", self.name, len(batch), exc,
                       extra={"batch_ops": len(batch), "error": type(exc).__name__})
        COMMIT_SECONDS.observe(time.monotonic() - started, self.name)
        self.batches += 1
        self.ops += len(batch)
        _BATCHES.inc_series(self._series)
        _OPS.inc_series(self._series, len(batch))
        return results, error

    def barrier(self) -> asyncio.Future[Any] | None:
        """The future of the last operation submitted, if it is not durable yet.

        Batches commit in submission order, so once it resolves, everything
        submitted before it is durable too (a read waits on this, C1). Deferred
        operations still gathered are committed at the end of this loop turn, not
        after their lag: a read does not wait for it.
        """
        last = self._last
        if last is None or last.done():
            return None
        if self._deferred_since is not None:
            self._deferred_since = None
            self._loop.call_soon(self._flush)
        return last

    def _main(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch = []
            while True:
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
                if len(batch) >= BATCH_OPS_MAX:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if not batch:
                continue
            results, error = self._commit(batch)
            try:
                self._loop.call_soon_threadsafe(self._resolve_from_thread, batch, results, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    def _resolve_from_thread(self, batch: list[tuple[Any, asyncio.Future[Any]]], results: Sequence[Any] | None,
                             error: BaseException | None) -> None:
        self._in_thread -= len(batch)
        if _resolve(batch, results, error, self._replies, self._listeners):
            self._report(results, error)


def _resolve(batch: list[tuple[Any, asyncio.Future[Any]]], results: Sequence[Any] | None,
             error: BaseException | None, replies: dict[asyncio.Future[Any], list[asyncio.Future[Any]]],
             listeners: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None]]) -> bool:
    """Resolve the batch's futures, their handlers' replies and listeners; True if the batch or one operation
    failed."""
    failed = error is not None
    for index, (_, future) in enumerate(batch):
        if error is None:
            result = results[index]  # type: ignore[index]
            if isinstance(result, BaseException):
                failed = True
            elif not future.done():
                # The usual case, without `_settle`'s calls: the result, to the future and every waiting handler.
                future.set_result(result)
                for reply in replies.pop(future, ()):
                    if not reply.done():
                        reply.set_result(result)
                if listeners and future in listeners:  # a release's future has none, the grant after it one
                    _notify(listeners, future)
                continue
        if not future.done():
            if error is not None:
                future.set_exception(error)
                future.exception()  # retrieved: a failed batch is logged once, futures nobody awaits stay quiet
            else:
                future.set_result(results[index])  # type: ignore[index]
        for reply in replies.pop(future, ()):
            _settle(reply, future)
        if listeners:
            _notify(listeners, future)
    return failed


def _notify(listeners: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None]],
            future: asyncio.Future[Any]) -> None:
    """Call ``future``'s listener, if it has one; what it raises is logged, and the batch goes on."""
    listener = listeners.pop(future, None)
    if listener is None:
        return
    try:
        listener(future)
    except Exception:  # noqa: BLE001 - one answer's bug must not keep the batch's other futures unresolved
        _log.exception("a commit's listener failed")


def _settle(reply: asyncio.Future[Any], future: asyncio.Future[Any]) -> None:
    """Give ``reply`` the outcome of ``future`` (done), unless its handler went away."""
    if reply.done():
        return
    if future.cancelled():
        reply.cancel()
        return
    error = future.exception()
    if error is not None:
        reply.set_exception(error)
    else:
        reply.set_result(future.result())

