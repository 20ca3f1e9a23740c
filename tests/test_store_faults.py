"""Fault scenarios for the fenced store, each with its broken control.

- S19: one holder, 8 threads, one token: false rejections 0 of N (control: `>` for `>=`).
- S20: a higher token arrives while a lower-token transaction is open: interleavings
  0 of N, with threads and with a separate process (control: check-then-write).
- S04: a write paused between its fence check and its commit while a higher token
  writes: stale commits 0 of N (control: check-then-write).
- S16: kill -9 of a writing process, reopen: HWM rollbacks 0 of N.

Every scenario prints one figure line, checks the audit trail (the white-box
oracle) for P2 violations, and on failure leaves the audit as JSON lines in the
test's tmp_path. STOCKADE_LONG=1 multiplies the counts by 10 (S19's by 50).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.core.errors import BackendUnavailable, StaleToken
from stockade.core.leases import Granted
from stockade.core.limits import LIST_PAGE_MAX
from stockade.core.tokens import FencingToken
from stockade.resources.store import AuditRecord, SQLiteStore
from stockade.testing.mutants import CheckThenWriteStore, StrictGreaterStore

LONG = int(os.environ.get("STOCKADE_LONG", "0") or 0)
SCALE = 10 if LONG else 1
WAIT_S = 10.0  # no unbounded waits, even in tests


def figure(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n{line}")


def all_audit(store: SQLiteStore, scope: str | None = None) -> list[AuditRecord]:
    records, after = [], 0
    while True:
        page = store.audit(scope, after_seq=after, limit=LIST_PAGE_MAX)
        records.extend(page)
        if len(page) < LIST_PAGE_MAX:
            return records
        after = page[-1].commit_seq


def p2_violations(records: list[AuditRecord]) -> list[AuditRecord]:
    """P2: per scope, once token y was accepted, no write with x < y is accepted later."""
    highest: dict[str, int] = {}
    bad = []
    for record in sorted(records, key=lambda r: r.commit_seq):
        if record.token_value < highest.get(record.scope, 0):
            bad.append(record)
        highest[record.scope] = max(highest.get(record.scope, 0), record.token_value)
    return bad


def keep_history(directory: Path, name: str, records: list[AuditRecord]) -> Path:
    """Leave the audit trail of a failed run next to the test (pytest keeps tmp_path)."""
    path = directory / f"{name}.audit.jsonl"
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(dataclasses.asdict(record)) + "\n")
    return path


def grant(coordinator_path: Path, scope: str) -> FencingToken:
    """A real token from the embedded coordinator (the holder of S19)."""
    with SQLiteCoordinator(coordinator_path) as coordinator:
        outcome = coordinator.try_acquire(
            scope, lease_id=new_lease_id(), holder="s19-holder", ttl_ms=60_000,
            wait_deadline_ns=coordinator.clock.now_ns(),
        )
        assert isinstance(outcome, Granted)
        return outcome.lease.token


# -- S19: one holder, many threads, one token ---------------------------------------------------------


@dataclass
class S19Figures:
    ok: int = 0
    false_rejections: int = 0
    busy_retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_s19(store_class, tmp_path: Path, *, threads: int, writes_per_thread: int, shared: bool) -> S19Figures:
    token = grant(tmp_path / "coord.db", "s19")
    path = tmp_path / f"s19-{store_class.__name__}-{'shared' if shared else 'own'}.db"
    first = store_class(path, cluster_id=token.cluster, busy_timeout_ms=30_000, keys="unsigned")
    stores = [first if shared else store_class(path, busy_timeout_ms=30_000, keys="unsigned") for _ in range(threads)]
    figures = S19Figures()
    barrier = threading.Barrier(threads)

    def writer(n: int) -> None:
        store = stores[n]
        barrier.wait(WAIT_S)
        ok = rejected = retries = 0
        for i in range(writes_per_thread):
            while True:
                try:
                    store.put("s19", f"t{n}-k{i % 16}", f"{n}:{i}", token=token)
                    ok += 1
                except StaleToken:
                    rejected += 1  # the current holder fenced out: a false rejection
                except BackendUnavailable as exc:
                    if exc.certain_no_effect and retries < writes_per_thread:
                        retries += 1  # busy, and certainly not applied: safe to retry
                        continue
                    raise
                break
        with figures.lock:
            figures.ok += ok
            figures.false_rejections += rejected
            figures.busy_retries += retries

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive(), "S19 writer hung"
    records = all_audit(first, "s19")
    assert len(records) == figures.ok, "every acknowledged write is in the audit trail, and nothing else"
    assert {r.token_value for r in records} <= {token.value}
    assert not p2_violations(records)
    for store in {id(s): s for s in stores}.values():
        store.close()
    return figures


@pytest.mark.parametrize("shared", [False, True], ids=["own-connection", "shared-object"])
def test_s19_one_holder_eight_threads_no_false_rejections(tmp_path, capsys, shared):
    threads, per_thread = 8, 1250 * SCALE if LONG else 250  # 2,000 writes (100,000 with STOCKADE_LONG=1)
    figures = run_s19(SQLiteStore, tmp_path, threads=threads, writes_per_thread=per_thread, shared=shared)
    total = threads * per_thread
    figure(capsys, f"S19 ({'shared object' if shared else 'own connection'} per thread) false rejections "
                   f"{figures.false_rejections} of {total} (busy retries {figures.busy_retries})")
    assert figures.ok == total
    assert figures.false_rejections == 0


@pytest.mark.parametrize("shared", [False, True], ids=["own-connection", "shared-object"])
def test_s19_control_strict_greater_is_caught(tmp_path, capsys, shared):
    threads, per_thread = 8, 50
    figures = run_s19(StrictGreaterStore, tmp_path, threads=threads, writes_per_thread=per_thread, shared=shared)
    figure(capsys, f"S19 control (> for >=) false rejections {figures.false_rejections} of {threads * per_thread}: "
                   f"caught")
    # Only the very first write can pass under `>`; every later one with the same token is refused.
    assert figures.false_rejections == threads * per_thread - 1


# -- S20: a higher token while a lower-token transaction is open --------------------------------------------


@dataclass
class S20Figures:
    iterations: int = 0
    interleavings: int = 0
    lower_aborted: int = 0
    p2_violations: int = 0
    lost_higher: int = 0
    contended: int = 0  # iterations where H was already trying while L's transaction was open


class _ThreadH:
    """H in a thread of this process, on its own connection (or on L's object)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def write(self, scope: str, token: FencingToken, values: dict[str, str]) -> tuple[str, int]:
        """Returns the outcome and when H began (CLOCK_MONOTONIC is shared by the processes of one boot)."""
        started_ns = time.monotonic_ns()
        try:
            for key, value in values.items():
                self.store.put(scope, key, value, token=token)
        except StaleToken:
            return "stale", started_ns
        return "ok", started_ns

    def close(self) -> None:
        pass


def _h_process(path: str, connection) -> None:
    """H in a separate process: write each requested batch, answer when done."""
    with SQLiteStore(path, busy_timeout_ms=30_000, keys="unsigned") as store:
        connection.send("ready")
        while True:
            request = connection.recv()
            if request is None:
                return
            scope, encoded, values = request
            connection.send(_ThreadH(store).write(scope, FencingToken.decode(encoded), values))


class _ProcessH:
    def __init__(self, path: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_h_process, args=(str(path), child), daemon=True)
        self.process.start()
        # Wait for the interpreter to start and open the store, so iteration 0 races like the rest.
        if not self.connection.poll(WAIT_S * 3) or self.connection.recv() != "ready":
            raise TimeoutError("H process did not start")

    def write(self, scope: str, token: FencingToken, values: dict[str, str]) -> tuple[str, int]:
        self.connection.send((scope, token.encode(), values))
        if not self.connection.poll(WAIT_S * 3):
            raise TimeoutError("H process did not answer")
        return self.connection.recv()

    def close(self) -> None:
        self.connection.send(None)
        self.process.join(WAIT_S)
        if self.process.is_alive():
            self.process.kill()


def run_s20(store_class, tmp_path: Path, *, iterations: int, h_mode: str, hold_s: float = 0.5) -> S20Figures:
    """L: transaction(t) { put a; signal; wait up to hold_s for H; put b }.  H: put a, put b with t+1.

    ``hold_s`` only bounds the wait: H is not held up by L's open transaction, so L goes on as soon as H is
    done; a busy host (load 24) needed more than 10 ms to run H in 12 % of the iterations."""
    cluster = "0123456789abcdef"
    path = tmp_path / f"s20-{store_class.__name__}-{h_mode}.db"
    scope = "s20"
    store_l = store_class(path, cluster_id=cluster, busy_timeout_ms=30_000, keys="unsigned")
    if h_mode == "process":
        h = _ProcessH(path)
    else:
        h = _ThreadH(store_l if h_mode == "shared-object"
                     else store_class(path, busy_timeout_ms=30_000, keys="unsigned"))
    figures = S20Figures()
    after_seq = 0
    try:
        for i in range(iterations):
            t = 2 * i + 1
            low, high = FencingToken(cluster, scope, t), FencingToken(cluster, scope, t + 1)
            step1_done, h_done = threading.Event(), threading.Event()
            h_outcome: list[tuple[str, int]] = []

            def run_h(step1_done=step1_done, h_done=h_done, h_outcome=h_outcome, high=high, i=i) -> None:
                step1_done.wait(WAIT_S)
                h_outcome.append(h.write(scope, high, {"a": f"H{i}", "b": f"H{i}"}))
                h_done.set()

            thread = threading.Thread(target=run_h)
            thread.start()
            try:
                with store_l.transaction(scope, token=low) as tx:
                    tx.put("a", f"L{i}-1")
                    step1_done.set()
                    h_done.wait(hold_s)  # H is not held up by the open transaction: L aborts at its commit
                    tx.put("b", f"L{i}-2")
            except StaleToken:
                figures.lower_aborted += 1
            finally:
                l_done_ns = time.monotonic_ns()
                step1_done.set()
                thread.join(WAIT_S * 4)
                assert not thread.is_alive(), "S20 H hung"
            if h_outcome and h_outcome[0][1] < l_done_ns:
                figures.contended += 1
            figures.iterations += 1
            records = all_audit(store_l, scope)
            new = [(r.key, r.token_value) for r in records if r.commit_seq > after_seq]
            after_seq = records[-1].commit_seq if records else after_seq
            l_steps = [n for n, (_, tv) in enumerate(new) if tv == t]
            h_steps = [n for n, (_, tv) in enumerate(new) if tv == t + 1]
            # Not interleaved: L's steps are all before H's write, or there are none (L aborted).
            if l_steps and (len(l_steps) != 2 or (h_steps and max(l_steps) > min(h_steps))):
                figures.interleavings += 1
            if (store_l.get(scope, "a").value, store_l.get(scope, "b").value) != (f"H{i}".encode(),) * 2:
                figures.lost_higher += 1
            assert [o for o, _ in h_outcome] == ["ok"] or store_class is not SQLiteStore
        figures.p2_violations = len(p2_violations(all_audit(store_l, scope)))
        if figures.interleavings or figures.p2_violations:
            keep_history(tmp_path, f"s20-{store_class.__name__}-{h_mode}", all_audit(store_l, scope))
    finally:
        h.close()
        if isinstance(h, _ThreadH) and h.store is not store_l:
            h.store.close()
        store_l.close()
    return figures


@pytest.mark.parametrize("h_mode", ["own-connection", "shared-object"])
def test_s20_higher_token_waits_for_open_transaction(tmp_path, capsys, h_mode):
    n = 200 * SCALE
    figures = run_s20(SQLiteStore, tmp_path, iterations=n, h_mode=h_mode)
    figure(capsys, f"S20 (H on {h_mode}) interleavings {figures.interleavings} of {figures.iterations} "
                   f"(H contended with the open transaction in {figures.contended}); "
                   f"P2 violations {figures.p2_violations}; higher writes lost {figures.lost_higher}; "
                   f"lower transactions aborted whole {figures.lower_aborted}")
    assert figures.iterations == n
    assert figures.contended >= n * 9 // 10, "the harness must really overlap H with L's open transaction"
    assert figures.interleavings == 0 and figures.p2_violations == 0 and figures.lost_higher == 0
    # L's transaction holds no lock while its block runs: H lands first and L's commit, which
    # checks the mark again, aborts L entirely (R6's other branch). Never half of L.


def test_s20_higher_token_in_another_process(tmp_path, capsys):
    n = 50 * SCALE
    figures = run_s20(SQLiteStore, tmp_path, iterations=n, h_mode="process")
    figure(capsys, f"S20 (H in another process) interleavings {figures.interleavings} of {figures.iterations} "
                   f"(contended {figures.contended}); P2 violations {figures.p2_violations}")
    assert figures.contended >= n * 9 // 10, "the harness must really overlap H with L's open transaction"
    assert figures.iterations == n and figures.interleavings == 0 and figures.p2_violations == 0
    assert figures.lost_higher == 0


@pytest.mark.parametrize("h_mode", ["own-connection", "process"])
def test_s20_control_check_then_write_is_caught(tmp_path, capsys, h_mode):
    n = 200 if h_mode != "process" else 50
    figures = run_s20(CheckThenWriteStore, tmp_path, iterations=n, h_mode=h_mode, hold_s=2.0)
    figure(capsys, f"S20 control (check-then-write, H on {h_mode}) interleavings {figures.interleavings} of "
                   f"{figures.iterations}, P2 violations {figures.p2_violations}: caught")
    assert figures.interleavings > 0 and figures.p2_violations > 0


# -- S04: write paused between fence check and commit --------------------------------------------------------


class PausingStore(SQLiteStore):
    """The real store with a fault hook inside its transaction, right after the fence check."""

    between_check_and_write = None

    def _raise_high_water(self, conn, scope, old, new):
        super()._raise_high_water(conn, scope, old, new)
        if self.between_check_and_write is not None:
            self.between_check_and_write(scope, None)


def run_s04(store_class, tmp_path: Path, *, iterations: int, hold_s: float) -> tuple[int, int]:
    """L.put(t) pauses after its check; H.put(t+1) runs meanwhile. Returns (stale commits, P2 violations)."""
    cluster = "0123456789abcdef"
    path = tmp_path / f"s04-{store_class.__name__}.db"
    with store_class(path, cluster_id=cluster, busy_timeout_ms=30_000, keys="unsigned") as store_l, \
            SQLiteStore(path, busy_timeout_ms=30_000, keys="unsigned") as store_h:
        stale_commits = 0
        for i in range(iterations):
            t = 2 * i + 1
            checked, h_done = threading.Event(), threading.Event()

            def pause(scope, token, checked=checked, h_done=h_done):
                checked.set()
                h_done.wait(hold_s)

            def run_h(checked=checked, h_done=h_done, i=i, t=t):
                checked.wait(WAIT_S)
                store_h.put("s04", "k", f"H{i}", token=FencingToken(cluster, "s04", t + 1))
                h_done.set()

            thread = threading.Thread(target=run_h)
            thread.start()
            store_l.between_check_and_write = pause
            try:
                store_l.put("s04", "k", f"L{i}", token=FencingToken(cluster, "s04", t))
            except StaleToken:
                pass
            finally:
                store_l.between_check_and_write = None
                checked.set()
                thread.join(WAIT_S * 4)
            if store_l.get("s04", "k").value != f"H{i}".encode():
                stale_commits += 1  # L's older write landed over H's newer one
        records = all_audit(store_l, "s04")
        violations = p2_violations(records)
        if violations:
            keep_history(tmp_path, f"s04-{store_class.__name__}", records)
        return stale_commits, len(violations)


def test_s04_paused_write_cannot_commit_after_a_higher_token(tmp_path, capsys):
    n = 100 * SCALE
    stale, violations = run_s04(PausingStore, tmp_path, iterations=n, hold_s=0.005)
    figure(capsys, f"S04 stale commits {stale} of {n}; P2 violations {violations}")
    assert stale == 0 and violations == 0


def test_s04_control_check_then_write_is_caught(tmp_path, capsys):
    n = 100
    stale, violations = run_s04(CheckThenWriteStore, tmp_path, iterations=n, hold_s=2.0)
    figure(capsys, f"S04 control (check-then-write) stale commits {stale} of {n}: caught")
    assert stale == n and violations == n


# -- S16: kill -9 while writing ------------------------------------------------------------------------------

_WRITER = """
import sys
from stockade.core.tokens import FencingToken
from stockade.resources.store import SQLiteStore
path, cluster = sys.argv[1], sys.argv[2]
with SQLiteStore(path, keys="unsigned") as store:
    value = store.high_water("s16") + 1
    while True:
        store.put("s16", "k%d" % (value % 8), str(value), token=FencingToken(cluster, "s16", value))
        print(value, flush=True)  # acknowledged: durable before this line is written
        value += 1
"""


def test_s16_kill_minus_9_never_rolls_back_the_high_water_mark(tmp_path, capsys):
    cluster = "0123456789abcdef"
    path = tmp_path / "s16.db"
    SQLiteStore(path, cluster_id=cluster, keys="unsigned").close()
    rounds, rollbacks = 3 * SCALE, 0
    for _ in range(rounds):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), cluster],
                                 stdout=subprocess.PIPE, text=True)
        last_acked = 0
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline or last_acked < 2:  # two acks at least, however busy the machine
            line = child.stdout.readline()
            if not line:
                break
            last_acked = int(line)
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT_S)
        child.stdout.close()
        assert last_acked > 1, "the writer acknowledged fewer than two writes"
        with SQLiteStore(path, keys="unsigned") as store:
            if store.high_water("s16") < last_acked:
                rollbacks += 1
            with pytest.raises(StaleToken):
                store.put("s16", "k", b"zombie", token=FencingToken(cluster, "s16", last_acked - 1))
            assert not p2_violations(all_audit(store, "s16"))
    figure(capsys, f"S16 HWM rollbacks {rollbacks} of {rounds} kill -9 restarts")
    assert rollbacks == 0
