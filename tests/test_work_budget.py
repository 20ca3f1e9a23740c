"""The work of a lock cycle and a fenced write, counted, against the budgets in `stockade.testing.budgets`.

Each budget test has controls that do more work the way a regression would (an
index re-added, an extra commit per change, debug logging on the request path)
and that the same check must catch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.work_budget import Meter, Served, Work, calls_of, served

import stockade
from stockade.coordinators.sqlite._rows import set_meta
from stockade.core.leases import AcquireRequest
from stockade.core.limits import RELEASE_LAG_MS_MAX
from stockade.testing.budgets import BUDGETS, over_budget

CYCLES = 20  # per measure; the figures are exact counts, the same on every run
WARMUP = 5
MEASURES = ("commits", "wal_frames", "wal_bytes", "statements", "calls", "log_appends", "log_bytes", "folds")


def _per_op(work: Work) -> dict[str, float]:
    return {name: work.per_op(name) for name in MEASURES}


def _measure_served(served_: Served, meter: Meter, step: Callable[[], None]) -> dict[str, float]:
    for _ in range(WARMUP):
        step()
    served_.on_loop(meter.hold_checkpoints)
    served_.on_loop(meter.start)
    counter = served_.counter
    counter.calls, counter.on = 0, True
    for _ in range(CYCLES):
        step()
    counter.on = False
    work = Work(CYCLES, calls=counter.calls)
    served_.on_loop(lambda: meter.stop(work))
    return _per_op(work)


def _serve_lock_cycle(data_dir: Path, control: Callable[[Served], None] | None = None,
                      release_lag_ms: int = RELEASE_LAG_MS_MAX, fold_changes: int | None = None) -> dict[str, float]:
    """A cycle's work. Each release is answered before its commit and commits with the next cycle's grant (the
    one of the warm-up's last cycle with the first measured grant; the last measured one after the count): with a
    lag of a minute, whatever the pace of the client, so the counts are exact. ``release_lag_ms`` 0: the control,
    a release that waits for its own commit, as before issue 29."""
    with served(data_dir, release_lag_ms=release_lag_ms) as s:
        if fold_changes is not None:  # so few that a fold comes in the run: its work is counted
            s.server.leases.log.fold_changes = fold_changes
        if control is not None:
            s.on_loop(lambda: control(s))
        coord = stockade.connect(s.url)
        try:
            return _measure_served(
                s, s.coordinator_meter(), lambda: coord.acquire("s", ttl_ms=10_000, keepalive=False).release())
        finally:
            coord.close()


def _serve_fenced_write(data_dir: Path, control: Callable[[Served], None] | None = None) -> dict[str, float]:
    with served(data_dir) as s:
        if control is not None:
            s.on_loop(lambda: control(s))
        coord = stockade.connect(s.url)
        store = stockade.open_store(s.url, cluster_id=coord.cluster_id)
        lease = coord.acquire("w", ttl_ms=60_000, keepalive=False)
        try:
            return _measure_served(s, s.store_meter(), lambda: store.put("w", "k", b"x" * 100, token=lease.token))
        finally:
            lease.release()
            store.close()
            coord.close()


def _embedded_lock_cycle(data_dir: Path, control: Callable[[Any], None] | None = None) -> dict[str, float]:
    coord = stockade.connect(f"sqlite:///{data_dir}/coord.db?process=embedded")
    try:
        records = coord._port.engine.records
        if control is not None:
            control(records)
        for _ in range(WARMUP):
            coord.acquire("s", ttl_ms=10_000, keepalive=False).release()
        meter = Meter(records.path, records._conn)
        meter.hold_checkpoints()
        meter.start()
        calls = calls_of(lambda: coord.acquire("s", ttl_ms=10_000, keepalive=False).release(), CYCLES)
        return _per_op(meter.stop(Work(CYCLES, calls=calls)))
    finally:
        coord.close()


# -- controls: the regressions each budget is there to catch --------------------------------------

def _frame_per_change_served(s: Served) -> None:
    """Each change appended as a frame of its own, with its own fdatasync (not one frame a batch)."""
    log = s.server.leases.log
    append = log.commit_records

    def one_by_one(changes: Any) -> Any:
        return [result for change in changes for result in append([change])]

    s.server.leases.committer._run_batch = one_by_one


def _fold_every_batch_served(s: Served) -> None:
    """The log folded into the file after every batch (a threshold of one change): a commit of the file each."""
    s.server.leases.log.fold_changes = 1


def _extra_index_store(s: Served) -> None:
    s.store_meter().conn.execute("CREATE INDEX IF NOT EXISTS budget_control ON audit (key, token_value)")


def _extra_commit_served(s: Served) -> None:
    """Every change committed, then a second transaction written after it (one more fsync each)."""
    file = s.server.leases.file
    commit_records = s.server.leases.log.commit_records

    def twice(changes: Any) -> Any:
        results = commit_records(changes)
        with file._write() as conn:
            _extra_commits.append(len(changes))
            set_meta(conn, "budget_control", str(len(_extra_commits)))  # a new value: an unchanged row writes no page
        return results

    s.server.leases.committer._run_batch = twice


def _checked_again_served(s: Served) -> None:
    """The server's validated acquire checked again by the engine (its checking `AcquireRequest`), as before the
    engine's trusted entry (`AcquireRequest.prevalidated`)."""
    engine = s.server.leases.engine
    attempt = engine.try_acquire_request

    def checked(request: AcquireRequest) -> Any:
        return attempt(AcquireRequest(request.cluster, request.scope, request.lease_id, request.holder,
                                      request.ttl_ms, request.wait_deadline_ns, request.live_until_ns))

    engine.try_acquire_request = checked


def _debug_logging(_: object) -> None:
    """The request path's debug lines formatted (a handler at DEBUG on the server's logger)."""
    logger = logging.getLogger("stockade.server")
    handler = logging.StreamHandler(open("/dev/null", "w"))  # noqa: SIM115 - closed with the logger below
    handler.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    _added.append((logger, handler))


_added: list[tuple[logging.Logger, logging.Handler]] = []
_extra_commits: list[int] = []


@pytest.fixture(autouse=True)
def _remove_handlers() -> Any:
    yield
    while _added:
        logger, handler = _added.pop()
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        handler.close()


def _extra_index_embedded(records: Any) -> None:
    records._conn.execute("CREATE INDEX IF NOT EXISTS budget_control ON history_recent (scope, seq)")


def _extra_commit_embedded(records: Any) -> None:
    write = records.write

    def write_twice() -> Any:
        from contextlib import contextmanager

        @contextmanager
        def unit() -> Any:
            with write() as tx:
                yield tx
            with records._write() as conn:
                _extra_commits.append(1)
                set_meta(conn, "budget_control", str(len(_extra_commits)))
        return unit()

    records.write = write_twice


# -- the budgets ---------------------------------------------------------------------------------

def test_serve_lock_cycle_within_budget(tmp_path: Path) -> None:
    measured = _serve_lock_cycle(tmp_path)
    assert over_budget("serve.lock_cycle", measured) == [], measured


def test_serve_lock_cycle_folded_within_budget(tmp_path: Path) -> None:
    measured = _serve_lock_cycle(tmp_path, fold_changes=2 * CYCLES)
    assert measured["folds"] > 0 and over_budget("serve.lock_cycle_folded", measured) == [], measured


def test_serve_fenced_write_within_budget(tmp_path: Path) -> None:
    measured = _serve_fenced_write(tmp_path)
    assert over_budget("serve.fenced_write", measured) == [], measured


def test_embedded_lock_cycle_within_budget(tmp_path: Path) -> None:
    measured = _embedded_lock_cycle(tmp_path)
    assert over_budget("embedded.lock_cycle", measured) == [], measured


@pytest.mark.parametrize(("control", "exceeds"), [
    (_frame_per_change_served, {"log_appends", "log_bytes"}),
    (_fold_every_batch_served, {"folds", "commits", "wal_frames", "statements"}),
    (_extra_commit_served, {"commits", "wal_frames", "statements"}),
    (_debug_logging, {"calls"}),
    (_checked_again_served, {"calls"}),
])
def test_serve_lock_cycle_controls_exceed(tmp_path: Path, control: Callable[[Served], None], exceeds: set[str]) -> None:
    found = over_budget("serve.lock_cycle", _serve_lock_cycle(tmp_path, control))
    assert {line.split()[1] for line in found} >= exceeds, found


@pytest.mark.parametrize(("control", "exceeds"), [
    (_extra_commit_served, {"commits", "wal_frames", "statements"}),
    (_fold_every_batch_served, {"folds", "commits", "wal_frames", "statements"}),
])
def test_serve_lock_cycle_folded_controls_exceed(tmp_path: Path, control: Callable[[Served], None],
                                                 exceeds: set[str]) -> None:
    found = over_budget("serve.lock_cycle_folded", _serve_lock_cycle(tmp_path, control, fold_changes=2 * CYCLES))
    assert {line.split()[1] for line in found} >= exceeds, found


def test_serve_lock_cycle_control_releases_waiting_for_their_commit_exceed(tmp_path: Path) -> None:
    """``--release-lag-ms 0``: every release answered only after a commit of its own, as before issue 29."""
    found = over_budget("serve.lock_cycle", _serve_lock_cycle(tmp_path, release_lag_ms=0))
    assert {line.split()[1] for line in found} >= {"log_appends", "log_bytes", "calls"}, found


@pytest.mark.parametrize(("control", "exceeds"), [
    (_extra_index_store, {"wal_frames", "wal_bytes"}),
    (_debug_logging, {"calls"}),
])
def test_serve_fenced_write_controls_exceed(tmp_path: Path, control: Callable[[Served], None],
                                            exceeds: set[str]) -> None:
    found = over_budget("serve.fenced_write", _serve_fenced_write(tmp_path, control))
    assert {line.split()[1] for line in found} >= exceeds, found


@pytest.mark.parametrize(("control", "exceeds"), [
    (_extra_index_embedded, {"wal_frames", "wal_bytes"}),
    (_extra_commit_embedded, {"commits", "wal_frames", "statements"}),
])
def test_embedded_lock_cycle_controls_exceed(tmp_path: Path, control: Callable[[Any], None],
                                             exceeds: set[str]) -> None:
    found = over_budget("embedded.lock_cycle", _embedded_lock_cycle(tmp_path, control))
    assert {line.split()[1] for line in found} >= exceeds, found


def test_over_budget_says_the_figure_and_the_benchmark() -> None:
    measured = dict(BUDGETS["serve.lock_cycle"], log_appends=2)
    (line,) = over_budget("serve.lock_cycle", measured)
    assert "log_appends 2 per operation, over its budget of 1" in line and "stockade bench" in line
