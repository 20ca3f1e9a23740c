"""Leader election (`coord.elect`, docs/election.md) on every coordinator backend.

The API runs on every ``backend`` of tests/conftest.py. The zombie leader and
the failover time need a coordinator that several processes share, so they
run on every backend but ``memory`` (one process's own engine): a real leader
process is SIGSTOPped past its lease while another is elected and writes; when
it wakes, its write with its old token must be refused by the fenced store.
The control writes through a store with the fence swapped out and must let the
zombie's write in. ``STOCKADE_LONG=1`` runs 50 rounds per backend and 20 kill -9.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sqlite3
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import HELPERS, PYTHON, python_env

import stockade
from stockade.client import AsyncLeadership, LeaderInfo, Leadership
from stockade.resources import sqlite_db

LONG = os.environ.get("STOCKADE_LONG") == "1"
ZOMBIE_ROUNDS = 50 if LONG else 2
CONTROL_ROUNDS = 3 if LONG else 1
KILLS = 20 if LONG else 1
SHARED = ["embedded", "http", "postgres", "etcd", "zookeeper"]  # every backend several processes share
TTL_MS = 1000
CANDIDATE = str(HELPERS / "election_candidate.py")
#: The candidates' ZooKeeper session timeout: a paused or killed candidate's node goes with its session, so
#: this is the failover time. The ensemble's minSessionTimeout (2 ticks) is 1000 ms; TTL_MS fits under it.
ZK_CANDIDATE_SESSION_MS = int(os.environ.get("STOCKADE_ZK_CANDIDATE_SESSION_MS", "1000"))


def _candidate_url(coord_url: str, backend: str) -> str:
    """The url the candidate processes use: on ZooKeeper, a session as short as the ensemble allows."""
    return f"{coord_url}?session_timeout_ms={ZK_CANDIDATE_SESSION_MS}" if backend == "zookeeper" else coord_url


# -- the API, on every backend ----------------------------------------------------------------------


def test_elect_publish_resign_and_the_next_candidate(coord_url, tmp_path):
    coord = stockade.connect(coord_url)
    other = stockade.connect(coord_url)
    try:
        assert coord.leader("orders") is None
        first = coord.elect("orders", ttl_ms=5000, identity="10.0.0.1:8080")
        assert isinstance(first, Leadership) and not first.lost
        seen = other.leader("orders")
        assert isinstance(seen, LeaderInfo)
        assert (seen.holder, seen.term, seen.name) == ("10.0.0.1:8080", first.term, "orders")
        assert first.token.scope == "orders" and first.term == first.token.value
        with pytest.raises(stockade.LockTimeout):
            other.elect("orders", ttl_ms=5000, wait_ms=0)
        # a candidate waits its turn; the watcher sees the change of leader
        won: list[Leadership] = []
        waiter = threading.Thread(
            target=lambda: won.append(other.elect("orders", ttl_ms=5000, wait_ms=20_000, identity="10.0.0.2:8080"))
        )
        waiter.start()
        deadline = time.monotonic() + 20
        while coord.inspect("orders").waiters == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert other.watch_leader("orders", since=seen, timeout_ms=50, poll_ms=10).term == seen.term  # timeout
        first.resign()
        assert first.lost and first.lost_cause == "resigned"
        waiter.join(30)
        changed = coord.watch_leader("orders", since=seen, timeout_ms=20_000, poll_ms=10)
        assert changed is not None and changed.holder == "10.0.0.2:8080" and changed.term > first.term
        (second,) = won
        assert second.term == changed.term
        second.resign()
        assert coord.watch_leader("orders", since=changed, timeout_ms=20_000, poll_ms=10) is None
    finally:
        coord.close()
        other.close()


@pytest.mark.parametrize("backend", ["embedded", "memory"])  # the checks are the client's, before any I/O
def test_bad_input_is_refused_before_any_io(coord_url):
    coord = stockade.connect(coord_url)
    try:
        for bad in [{"ttl_ms": 5}, {"ttl_ms": 1000, "wait_ms": -1}, {"ttl_ms": 1000, "identity": "a b"}]:
            with pytest.raises(stockade.InvalidArgument):
                coord.elect("orders", **bad)
        with pytest.raises(stockade.InvalidArgument):
            coord.elect("no spaces", ttl_ms=1000)
        for bad in [{"timeout_ms": -1}, {"timeout_ms": 10**9}, {"timeout_ms": 10, "poll_ms": 1}]:
            with pytest.raises(stockade.InvalidArgument):
                coord.watch_leader("orders", since=None, **bad)
        with pytest.raises(stockade.InvalidArgument):
            coord.watch_leader("orders", since="leader", timeout_ms=10)
        assert coord.leader("orders") is None  # nothing changed
    finally:
        coord.close()


def test_the_leaders_token_fences_the_store_and_an_adapter(tmp_path):
    """The term's token goes into `open_store` (in the block, without ``token=``, K1) and into the
    user's own SQLite database through `stockade.resources.sqlite_db`; the former leader is refused by both."""
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    conn = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    sqlite_db.install(conn, cluster_id=coord.cluster_id)
    conn.execute("CREATE TABLE config (k TEXT PRIMARY KEY, v TEXT)")
    with coord.elect("config", ttl_ms=5000) as old:
        store.put("config", "owner", b"old")
        with sqlite_db.fenced(conn, old.token, keys=coord.verify_keys()):
            conn.execute("INSERT OR REPLACE INTO config VALUES ('owner', 'old')")
    with coord.elect("config", ttl_ms=5000) as new:
        store.put("config", "owner", b"new", token=new.token)
        with sqlite_db.fenced(conn, new.token, keys=coord.verify_keys()):
            conn.execute("INSERT OR REPLACE INTO config VALUES ('owner', 'new')")
    with pytest.raises(stockade.StaleToken):
        store.put("config", "owner", b"zombie", token=old.token)
    with pytest.raises(stockade.StaleToken), sqlite_db.fenced(conn, old.token, keys=coord.verify_keys()):
        conn.execute("INSERT OR REPLACE INTO config VALUES ('owner', 'zombie')")
    assert store.get("config", "owner").value == b"new"
    assert conn.execute("SELECT v FROM config").fetchall() == [("new",)]
    conn.close()
    store.close()
    coord.close()


@pytest.mark.parametrize("backend", ["embedded", "memory"])
def test_async_leadership(coord_url):
    async def body() -> None:
        async with stockade.connect_async(coord_url) as coord:
            async with await coord.elect("jobs", ttl_ms=5000, identity="a:1") as leadership:
                assert isinstance(leadership, AsyncLeadership)
                seen = await coord.leader("jobs")
                assert seen is not None and (seen.holder, seen.term) == ("a:1", leadership.term)
                assert not await leadership.wait_lost(timeout_ms=10)
            assert leadership.lost
            assert await coord.watch_leader("jobs", since=seen, timeout_ms=5000, poll_ms=10) is None

    asyncio.run(body())


def test_a_leader_that_stops_renewing_learns_it_lost(tmp_path):
    """``lost`` is the lease's (K2): the local deadline passes without a renewal."""
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    leadership = coord.elect("orders", ttl_ms=300)
    leadership.lease._stop.set()  # the keepalive stops, as in a process that cannot reach the coordinator
    assert leadership.wait_lost(timeout_ms=10_000)
    assert "deadline" in leadership.lost_cause
    with pytest.raises(stockade.LeaseLost):
        leadership.raise_if_lost()
    coord.close()


# -- the zombie leader and the failover time: real processes, on every shared backend -------------------


class Lines:
    """Reads a child's stdout lines on a thread, each with the monotonic time it arrived."""

    def __init__(self, child: subprocess.Popen, into: queue.Queue | None = None) -> None:
        self.child = child
        self.queue: queue.Queue = into if into is not None else queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.queue.put((time.monotonic(), self.child.pid, line.strip()))

    def next(self, timeout_s: float = 90) -> tuple[float, int, str]:
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line from the candidate in {timeout_s} s") from None


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, CANDIDATE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=python_env(), text=True,
    )


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGCONT)
        child.kill()
    child.wait(10)


def _zombie_rounds(coord_url: str, child_url: str, tmp_path: Path, rounds: int,
                   control_rounds: int) -> tuple[int, int]:
    """Each round: the child is elected and checks it leads, is SIGSTOPped, this process is elected once
    the child's lease lapsed and writes, then the child wakes and writes with its token. The last
    ``control_rounds`` write through a store with the fence swapped out (the control).
    Returns the child's writes accepted after the new leader's: (fenced rounds, control rounds)."""
    coord = stockade.connect(coord_url)
    store_path = tmp_path / "store.db"
    store = stockade.open_store(f"sqlite:///{store_path}", cluster_id=coord.cluster_id)
    child = _spawn("zombie", child_url, str(store_path), "leader")
    lines = Lines(child)
    accepted = [0, 0]
    try:
        assert child.stdin is not None
        for index in range(rounds + control_rounds):
            control = index >= rounds
            child.stdin.write("round fencing-off\n" if control else "round\n")
            child.stdin.flush()
            _, _, line = lines.next()
            old_term = int(line.split()[1])
            child.send_signal(signal.SIGSTOP)
            # granted only once the paused leader's lease lapsed on the coordinator
            with coord.elect("leader", ttl_ms=10_000, wait_ms=60_000, identity="new-leader") as new:
                assert new.term > old_term
                mine = f"written by term {new.term}".encode()
                store.put("leader", "state", mine, token=new.token)
                child.send_signal(signal.SIGCONT)
                child.stdin.write("write\n")
                child.stdin.flush()
                _, _, verdict = lines.next()
                assert verdict in ("accepted", "rejected")
                accepted[control] += verdict == "accepted"
                assert (store.get("leader", "state").value == mine) == (verdict == "rejected")
        child.stdin.close()
        child.wait(30)
    finally:
        _stop(child)
        store.close()
        coord.close()
    return accepted[0], accepted[1]


def _failover_gaps_ms(coord_url: str, child_url: str, kills: int) -> list[float]:
    """Two candidates stand; the leader is killed (kill -9) and the time until the other is elected is
    measured, ``kills`` times (a fresh candidate replaces each one killed)."""
    arrivals: queue.Queue = queue.Queue()
    children: dict[int, subprocess.Popen] = {}
    observer = stockade.connect(coord_url)

    def stand() -> None:
        child = _spawn("stand", child_url, "failover")
        children[child.pid] = child
        Lines(child, arrivals)

    def next_leader(timeout_s: float = 90) -> tuple[float, int, int]:
        while True:
            try:
                at, pid, line = arrivals.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no new leader in {timeout_s} s") from None
            if line.startswith("leader"):
                return at, pid, int(line.split()[1])

    gaps_ms: list[float] = []
    try:
        stand()
        stand()
        _, leader_pid, term = next_leader()
        for _ in range(kills):
            # the other candidate waits in the queue before the kill (its process start is not failover time)
            deadline = time.monotonic() + 90
            while observer.inspect("failover").waiters < 1:
                assert time.monotonic() < deadline, "the other candidate never queued"
                time.sleep(0.01)
            killed_at = time.monotonic()
            children[leader_pid].kill()
            children.pop(leader_pid).wait(10)
            at, leader_pid, new_term = next_leader()
            assert new_term > term and leader_pid in children
            seen = observer.leader("failover")
            assert seen is not None and seen.term >= new_term
            gaps_ms.append((at - killed_at) * 1000)
            term = new_term
            stand()
    finally:
        for child in children.values():
            _stop(child)
        observer.close()
    return gaps_ms


@pytest.mark.parametrize("backend", SHARED)
def test_a_zombie_leader_is_refused_by_the_resource_and_a_dead_one_replaced(coord_url, tmp_path, backend, keyring_here):
    """The acceptance run, one server per backend: the zombie rounds beside their control (which must
    let the zombie in), then the time from a leader's kill -9 to the next leader (TTL 1 s)."""
    child_url = _candidate_url(coord_url, backend)
    accepted, control_accepted = _zombie_rounds(coord_url, child_url, tmp_path, ZOMBIE_ROUNDS, CONTROL_ROUNDS)
    gaps_ms = _failover_gaps_ms(coord_url, child_url, KILLS)
    print(f"\nelection [{backend}]: zombie writes accepted after the new leader's {accepted} of {ZOMBIE_ROUNDS}; "
          f"control (fencing off) {control_accepted} of {CONTROL_ROUNDS}; leader death to new leader "
          f"median {statistics.median(gaps_ms):.0f} ms over {len(gaps_ms)} kill -9 "
          f"(min {min(gaps_ms):.0f}, max {max(gaps_ms):.0f}), TTL {TTL_MS} ms, "
          f"candidates at {child_url.rpartition('?')[2] or 'default options'}")
    assert accepted == 0
    assert control_accepted == CONTROL_ROUNDS
    assert len(gaps_ms) == KILLS


def test_the_zombie_leader_example_runs(tmp_path):
    """examples/zombie_leader.py: A frozen by a real SIGSTOP, B elected and writing, A refused by both resources.
    (Its control is the acceptance test's: the same zombie write through a store without the fence gets in.)"""
    example = Path(__file__).resolve().parent.parent / "examples" / "zombie_leader.py"
    result = subprocess.run(
        [PYTHON, str(example), str(tmp_path / "demo")], capture_output=True, text=True, timeout=120, env=python_env()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "A: the store REFUSED my write" in out and "A: the app database REFUSED my write" in out
    assert out.index("B: the store accepted my write") < out.index("A: woke up")
    assert "narrator: leader now: B:" in out and "store holds: 'written by B" in out
