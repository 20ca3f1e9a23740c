"""The group committer's inline path: a lone write committed on the loop, never resolved before its COMMIT;
deferred writes (a release's) riding with the next write, or committed after their lag."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stockade.server._groupcommit import GroupCommitter


class _Recorder:
    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.committed: list[object] = []  # ops, in commit order
        self.batches: list[list[object]] = []  # the ops of each transaction
        self.threads: list[str] = []

    def __call__(self, ops):  # type: ignore[no-untyped-def]
        self.threads.append(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("disk gone")
        self.committed.extend(ops)
        self.batches.append(list(ops))
        return [f"ok-{op}" for op in ops]


def _watch(future: asyncio.Future, rec: _Recorder, op: object, seen: list[str]) -> None:
    # Runs when the future resolves: its op must already be committed (nothing acknowledged before its fsync).
    future.add_done_callback(lambda f: seen.append("durable" if op in rec.committed else "EARLY"))


def test_lone_write_commits_inline_and_resolves_only_after_commit():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop)
        committer.start()
        try:
            seen: list[str] = []
            future = committer.submit("a")
            _watch(future, rec, "a", seen)
            assert not future.done() and rec.committed == []
            assert await future == "ok-a"
            assert rec.threads == [threading.current_thread().name]  # the loop's own thread
            assert seen == ["durable"] and committer.barrier() is None
        finally:
            committer.stop()

    asyncio.run(main())


def test_several_writes_in_one_turn_commit_inline_in_one_batch_and_resolve_only_after_it():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, inline_ops_max=3)
        committer.start()
        try:
            seen: list[str] = []
            futures = [committer.submit(i) for i in range(3)]
            for i, f in enumerate(futures):
                _watch(f, rec, i, seen)
            assert not any(f.done() for f in futures) and rec.committed == []
            assert await asyncio.gather(*futures) == ["ok-0", "ok-1", "ok-2"]
            assert rec.committed == [0, 1, 2]
            assert rec.threads == [threading.current_thread().name]  # one batch, on the loop's own thread
            assert seen == ["durable"] * 3 and committer.barrier() is None
        finally:
            committer.stop()

    asyncio.run(main())


def _writes_a_turn_apart(gather_turns: int) -> list[list[object]]:
    """A write, and another submitted in the loop's next turn (as a request read by the next poll is): the
    batches they commit in."""
    async def main() -> list[list[object]]:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, gather_turns=gather_turns)
        committer.start()
        try:
            first = committer.submit("a")
            later: list[asyncio.Future] = []
            loop.call_soon(lambda: later.append(committer.submit("b")))  # after the first turn's end (`_flush`)
            assert await first == "ok-a"
            assert await later[0] == "ok-b"
            assert rec.committed == ["a", "b"]  # in submission order either way
            return rec.batches
        finally:
            committer.stop()

    return asyncio.run(main())


def test_a_write_of_the_next_turn_joins_the_batch():
    # The batch waits one more turn of the loop (`GATHER_TURNS`), whose poll reads what arrived meanwhile: one
    # commit (one fsync) for both writes.
    assert _writes_a_turn_apart(gather_turns=1) == [["a", "b"]]


def test_control_without_the_extra_turn_a_write_of_the_next_turn_commits_alone():
    assert _writes_a_turn_apart(gather_turns=0) == [["a"], ["b"]]


def test_more_writes_in_one_turn_than_inline_ops_max_go_to_the_thread_in_order():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder(delay_s=0.02)
        committer = GroupCommitter("t", rec, loop, inline_ops_max=2)
        committer.start()
        try:
            seen: list[str] = []
            first = [committer.submit(i) for i in range(3)]
            for i, f in enumerate(first):
                _watch(f, rec, i, seen)
            await asyncio.sleep(0.005)  # the thread is now committing the first batch
            late = [committer.submit(i) for i in range(3, 5)]  # while it is busy: queued behind it
            for i, f in zip(range(3, 5), late, strict=True):
                _watch(f, rec, i, seen)
            barrier = committer.barrier()
            assert barrier is late[-1]
            assert await asyncio.gather(*first, *late) == [f"ok-{i}" for i in range(5)]
            assert rec.committed == list(range(5))
            assert all(name.startswith("stockade-commit-") for name in rec.threads)
            assert seen == ["durable"] * 5
            # Idle again: the next lone write is inline.
            assert await committer.submit(5) == "ok-5"
            assert rec.threads[-1] == threading.current_thread().name
        finally:
            committer.stop()

    asyncio.run(main())


@pytest.mark.parametrize("burst", [1, 3])
def test_a_failed_commit_fails_every_write_of_the_batch(burst):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        committer = GroupCommitter("t", _Recorder(fail=True), loop)
        committer.start()
        try:
            futures = [committer.submit(i) for i in range(burst)]
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert all(isinstance(r, RuntimeError) for r in results)
        finally:
            committer.stop()

    asyncio.run(main())


def test_inline_off_uses_the_thread_for_a_lone_write():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, inline=False)
        committer.start()
        try:
            assert await committer.submit("a") == "ok-a"
            assert rec.threads == ["stockade-commit-t"]
        finally:
            committer.stop()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["batch raises", "one op fails"])
def test_a_failed_coordinator_commit_is_reported_so_the_server_stops(how):
    # The server's in-memory lease table may then differ from coord.db: it must fail-stop.
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        if how == "batch raises":
            run = _Recorder(fail=True)
        else:
            def run(ops):  # type: ignore[no-untyped-def]
                return [RuntimeError("constraint") if op == "b" else None for op in ops]
        committer = GroupCommitter("coordinator", run, loop)
        reports: list[str] = []
        committer.on_failure = reports.append
        committer.start()
        try:
            futures = [committer.submit(op) for op in ("a", "b")]
            await asyncio.gather(*futures, return_exceptions=True)
            ok = committer.submit("c")  # a healthy commit reports nothing more
            await asyncio.gather(ok, return_exceptions=True)
            await asyncio.sleep(0.05)
        finally:
            committer.stop()
        return reports

    reports = asyncio.run(main())
    assert reports and all("coordinator" in r for r in reports)


def test_server_stops_with_an_io_error_status_when_told_a_commit_failed(tmp_path):
    from stockade.server.app import EXIT_COMMIT_FAILED, Server, ServerConfig

    async def main() -> int:
        server = Server(ServerConfig(data_dir=tmp_path, port=0))
        await server.start()
        server.leases.committer.on_failure("coordinator batch failed: disk gone")
        await asyncio.wait_for(server.serve_until_stopped(), 10)
        return server.exit_status

    assert asyncio.run(main()) == EXIT_COMMIT_FAILED


def _reply_order(through_thread: bool, shield: bool) -> list[str]:
    """Submit two writes, wait on one through a reply, cancel the other's reply; what was seen, in order."""
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, inline=not through_thread)
        committer.start()
        reply_of = asyncio.shield if shield else committer.reply  # shield: the control (what handlers used)
        try:
            seen: list[str] = []
            kept, dropped = committer.submit("a"), committer.submit("b")
            # Registered first, so it runs first among the write's callbacks: is the reply already resolved?
            kept.add_done_callback(lambda f: seen.append(f"reply done: {reply.done()}"))
            reply, gone = reply_of(kept), reply_of(dropped)
            _watch(reply, rec, "a", seen)
            gone.cancel()  # the client went away
            assert await reply == "ok-a"
            assert await dropped == "ok-b" and not dropped.cancelled() and rec.committed == ["a", "b"]
            assert await reply_of(kept) == "ok-a"  # asked for after the write: at once
            return seen
        finally:
            committer.stop()

    return asyncio.run(main())


@pytest.mark.parametrize("through_thread", [False, True])
def test_a_reply_resolves_with_its_write_and_a_cancelled_one_leaves_the_write_alone(through_thread):
    """A handler's reply is set in the step its write is (a loop turn sooner than asyncio.shield's)."""
    assert _reply_order(through_thread, shield=False) == ["reply done: True", "durable"]
    assert _reply_order(through_thread, shield=True)[0] == "reply done: False"  # the control: a turn later


def test_a_reply_carries_a_failed_batch():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        committer = GroupCommitter("t", _Recorder(fail=True), loop)
        committer.start()
        try:
            with pytest.raises(RuntimeError, match="disk gone"):
                await committer.reply(committer.submit("a"))
        finally:
            committer.stop()

    asyncio.run(main())


def _listen_order(through_thread: bool, control: bool) -> list[str]:
    """A write with a listener (`listen`), or with a done-callback (the control): what was seen, in order."""
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, inline=not through_thread)
        committer.start()
        try:
            seen: list[str] = []
            first, second = committer.submit("a"), committer.submit("b")

            def listener(future: asyncio.Future) -> None:
                # In the step that resolves the batch: its next write is not resolved yet.
                seen.append(f"{future.result()} {'durable' if 'a' in rec.committed else 'EARLY'}, "
                            f"next resolved: {second.done()}")
                raise ZeroDivisionError("a listener's bug")  # logged; the batch's other futures still resolve

            if control:
                first.add_done_callback(listener)
            else:
                committer.listen(first, listener)
            second.add_done_callback(lambda f: seen.append("second resolved"))
            assert await second == "ok-b"
            seen.append("after the batch's step")
            committer.listen(first, lambda f: seen.append(f"late: {f.result()}"))  # done already: at once
            return seen
        finally:
            committer.stop()

    return asyncio.run(main())


@pytest.mark.parametrize("through_thread", [False, True])
def test_a_listener_runs_in_the_step_that_resolves_its_write(through_thread):
    """Called after the COMMIT, before the loop's next turn (a done-callback, the control, runs a turn later)."""
    assert _listen_order(through_thread, control=False) == [
        "ok-a durable, next resolved: False", "second resolved", "after the batch's step", "late: ok-a"]
    assert _listen_order(through_thread, control=True)[0] == "ok-a durable, next resolved: True"  # a turn later


# -- deferred writes (a release answered before its commit, docs/rules.md C3) ---------------------------------

LAG_MINUTE_MS = 60_000  # no deferred write commits by its lag within a test


def test_a_deferred_write_rides_with_the_next_write_in_order():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, lag_ms=LAG_MINUTE_MS)
        committer.start()
        try:
            released = committer.defer("release")
            for _ in range(3):
                await asyncio.sleep(0)
            assert rec.batches == [] and not released.done()  # turns went by: it started no commit
            granted = committer.submit("grant")
            assert await granted == "ok-grant" and released.result() == "ok-release"
            assert rec.batches == [["release", "grant"]]  # one commit, the release first
            # The same in one turn, and a deferred write after a submitted one in that turn goes with it.
            futures = [committer.defer("r1"), committer.submit("g1"), committer.defer("r2")]
            assert await asyncio.gather(*futures) == ["ok-r1", "ok-g1", "ok-r2"]
            assert rec.batches[1:] == [["r1", "g1", "r2"]]
        finally:
            committer.stop()

    asyncio.run(main())


def test_a_lone_deferred_write_commits_after_its_lag_and_not_sooner():
    """Its lag counts from its own deferral, also when the timer was armed for one taken along before it."""
    lag_ms = 100

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, lag_ms=lag_ms)
        committer.start()
        waited_ms = []
        try:
            committer.defer("r0")
            await committer.submit("g0")  # took r0 along: the timer armed for r0 stays, and finds nothing due
            for op in ("r1", "r2"):
                deferred_at = loop.time()
                assert await committer.defer(op) == f"ok-{op}"
                waited_ms.append((loop.time() - deferred_at) * 1000)
            assert rec.batches == [["r0", "g0"], ["r1"], ["r2"]]
            return waited_ms
        finally:
            committer.stop()

    waited_ms = asyncio.run(main())
    print(f"\nlone deferred writes committed after {[round(w, 1) for w in waited_ms]} ms (lag {lag_ms} ms)")
    assert all(w >= lag_ms - 1 for w in waited_ms), waited_ms  # the timer may fire up to 1 ms early


def test_a_barrier_and_a_stop_commit_deferred_writes_at_once():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, lag_ms=LAG_MINUTE_MS)
        committer.start()
        released = committer.defer("read")
        barrier = committer.barrier()
        assert barrier is released
        assert await asyncio.wait_for(barrier, 10) == "ok-read"  # a read does not wait for the lag
        stopped = committer.defer("stop")
        committer.commit_gathered()  # what a graceful stop does on the loop first
        await loop.run_in_executor(None, committer.stop)
        assert rec.batches == [["read"], ["stop"]] and rec.threads[-1] == "stockade-commit-t"
        assert await asyncio.wait_for(stopped, 10) == "ok-stop"  # the thread's results are resolved on the loop

    asyncio.run(main())


def test_control_without_a_lag_a_deferred_write_commits_at_the_end_of_its_turn():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rec = _Recorder()
        committer = GroupCommitter("t", rec, loop, lag_ms=0, gather_turns=0)  # the lag alone: no turn of company
        committer.start()
        try:
            released = committer.defer("release")
            await asyncio.sleep(0)
            assert rec.batches == [["release"]] and released.result() == "ok-release"
        finally:
            committer.stop()

    asyncio.run(main())
