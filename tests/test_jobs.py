"""Fenced jobs (stockade.recipes.jobs): at most once in effect, uncertain when that cannot be known.

The race test runs worker processes through the same job keys with kill -9 and
SIGSTOP mid-job (tests/helpers/jobs_race.py); its control, a once that checks
"done?" and then runs without a lease over the whole job, applies effects twice.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers.jobs_race import figure, race

import stockade
from stockade.core.errors import InvalidArgument, LimitExceeded
from stockade.recipes import jobs

LONG = os.environ.get("STOCKADE_LONG") == "1"


@pytest.fixture
def pair(tmp_path: Path):
    coord = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path}/store.db", cluster_id=coord.cluster_id)
    yield coord, store
    store.close()
    coord.close()


def test_once_runs_once_and_a_retry_returns_the_recorded_result(pair):
    coord, store = pair
    calls = []

    def job(ctx: jobs.JobContext) -> dict[str, int]:
        calls.append(ctx.token.value)
        store.put(ctx.scope, "effect", b"x", token=ctx.token)
        return {"rows": 3}

    assert jobs.once(coord, store, "report-1", job) == {"rows": 3}
    assert jobs.once(coord, store, "report-1", job) == {"rows": 3}
    assert len(calls) == 1
    record = jobs.status(store, "report-1")
    assert record is not None and record.state == "done" and record.token_value == calls[0]
    assert record.result == '{"rows":3}'


def test_a_job_that_raised_is_uncertain_until_reconciled_or_forgotten(pair):
    coord, store = pair

    def boom(ctx: jobs.JobContext) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        jobs.once(coord, store, "j", boom)
    with pytest.raises(jobs.JobUncertain) as info:
        jobs.once(coord, store, "j", lambda ctx: 1)
    assert info.value.key == "j" and "disk full" in str(info.value) and info.value.token_value > 0
    assert [r.key for r in jobs.uncertain(coord, store)] == ["j"]
    assert jobs.reconcile(coord, store, "j", result=[1, 2]).reconciled
    assert jobs.once(coord, store, "j", lambda ctx: 99) == [1, 2]
    assert jobs.uncertain(coord, store) == []
    with pytest.raises(InvalidArgument):
        jobs.reconcile(coord, store, "j", result=3)  # done already
    assert jobs.forget(coord, store, "j") is not None
    assert jobs.once(coord, store, "j", lambda ctx: 99) == 99


def test_an_uncertain_job_fences_out_its_starter(pair):
    """The caller that finds a job started raises the scope's mark: the starter's late write is refused."""
    coord, store = pair
    lease = coord.acquire("job:late", ttl_ms=200)
    store.put("job:late", jobs.RECORD_KEY,
              jobs.encode_record(jobs.JobRecord("late", "started", "a", lease.token.value, 1)), token=lease.token)
    lease.release()
    with pytest.raises(jobs.JobUncertain) as info:
        jobs.once(coord, store, "late", lambda ctx: 1)
    assert info.value.record.fenced_by > lease.token.value
    with pytest.raises(stockade.StaleToken):
        store.put("job:late", "effect", b"late", token=lease.token)


def test_a_paused_earlier_holder_cannot_start_the_job_under_a_later_one(pair):
    """The later caller raises the mark before it reads: the earlier holder's late start and effect are refused.

    The earlier holder read "never started" under its lease, then paused past it;
    it wakes between the later caller's fence write and its read of the record.
    """
    coord, store = pair
    early = coord.acquire("job:p", ttl_ms=200)
    early.release()  # its lease is gone; it does not know yet
    refused = []

    class WakesInBetween:
        def __init__(self) -> None:
            self.woke = False

        def __getattr__(self, name: str):
            return getattr(store, name)

        def get(self, scope: str, key: str):
            if key == jobs.RECORD_KEY and not self.woke and store.get(scope, jobs.FENCE_KEY) is not None:
                self.woke = True
                for k, v in [(jobs.RECORD_KEY, jobs.encode_record(jobs.JobRecord("p", "started", "early",
                                                                                 early.token.value, 1))),
                             ("effect/early", b"1")]:
                    try:
                        store.put(scope, k, v, token=early.token)
                    except stockade.StaleToken:
                        refused.append(k)
            return store.get(scope, key)

    wrapped = WakesInBetween()
    assert jobs.once(coord, wrapped, "p", lambda ctx: store.put(ctx.scope, "effect/late", b"1", token=ctx.token)
                     and "ran") == "ran"
    assert wrapped.woke and refused == [jobs.RECORD_KEY, "effect/early"]
    assert [i.key for i in store.list("job:p") if i.key.startswith("effect/")] == ["effect/late"]


def test_bad_input_is_refused_and_changes_nothing(pair):
    coord, store = pair
    for key in ["", "a b", "x" * 197, 5, None]:
        with pytest.raises(InvalidArgument):
            jobs.once(coord, store, key, lambda ctx: 1)  # type: ignore[arg-type]
    for fn in ["not callable", None]:  # None was taken as 'no fn' and left the job started, uncertain
        with pytest.raises(InvalidArgument):
            jobs.once(coord, store, "k", fn)  # type: ignore[arg-type]
    for bound in [0, jobs.RESULT_BYTES_CEILING + 1, True]:
        with pytest.raises(InvalidArgument):
            jobs.once(coord, store, "k", lambda ctx: 1, result_bytes_max=bound)
    assert jobs.status(store, "k") is None
    with pytest.raises(LimitExceeded):
        jobs.once(coord, store, "big", lambda ctx: "x" * 100, result_bytes_max=10)
    with pytest.raises(InvalidArgument):
        jobs.once(coord, store, "odd", lambda ctx: object())
    for key in ["big", "odd"]:  # the job ran; its result could not be kept: uncertain, not done
        record = jobs.status(store, key)
        assert record is not None and record.uncertain
    with pytest.raises(InvalidArgument):
        jobs.reconcile(coord, store, "big", result=float("nan"))


def test_async_once_on_memory(tmp_path: Path):
    async def main() -> None:
        coord = await stockade.connect_async("memory://jobs-test")
        store = await stockade.open_store_async("memory://jobs-test", cluster_id=coord.cluster_id,
                                                keys=coord.verify_keys())
        calls = []

        async def job(ctx: jobs.JobContext) -> str:
            calls.append(1)
            await store.put(ctx.scope, "effect", b"x", token=ctx.token)
            return "ok"

        assert await jobs.once_async(coord, store, "a", job) == "ok"
        assert await jobs.once_async(coord, store, "a", job) == "ok"
        assert calls == [1]

        async def boom(ctx: jobs.JobContext) -> str:
            raise KeyError("x")

        with pytest.raises(KeyError):
            await jobs.once_async(coord, store, "b", boom)
        assert [r.key for r in await jobs.uncertain_async(coord, store)] == ["b"]
        with pytest.raises(jobs.JobUncertain):
            await jobs.once_async(coord, store, "b", job)
        await jobs.reconcile_async(coord, store, "b", result="fixed")
        assert await jobs.once_async(coord, store, "b", job) == "fixed"
        await jobs.forget_async(coord, store, "b")
        assert await jobs.status_async(store, "b") is None
        with pytest.raises(InvalidArgument):
            await jobs.once_async(coord, store, "c", lambda ctx: 1)  # not a coroutine function

    asyncio.run(main())


def test_racing_workers_with_kill_and_stop_apply_each_job_at_most_once(tmp_path: Path):
    keys = 1000 if LONG else 16
    verdict = race(tmp_path / "race", workers=8, keys=keys, faults_each=keys // 30 if LONG else 1,
                   timeout_s=2400 if LONG else 600)
    print(figure(verdict))
    assert verdict.effects_twice == 0, figure(verdict)
    assert verdict.started_twice == 0 and verdict.rerun_after_done == 0, figure(verdict)
    assert verdict.killed_reported_done == 0 and verdict.killed_not_uncertain == 0, figure(verdict)
    assert verdict.unexplained_uncertain == 0 and not verdict.notes, (figure(verdict), verdict.notes)
    assert verdict.kills >= 2 and verdict.stopped >= 1 and verdict.done + verdict.uncertain == keys, figure(verdict)


def test_control_check_then_run_without_the_lease_applies_effects_twice(tmp_path: Path):
    verdict = race(tmp_path / "control", workers=8, keys=60, mode="naive")  # on k00000 two workers meet: a sure race
    print(figure(verdict))
    assert verdict.effects_twice > 0, figure(verdict)
