"""Run the sharded key-value example with writer failovers, then check it (prints a JSON report).

``python examples/shardkv/run.py --url postgresql://user@host:5432/db --shards 8 --nodes 3 --failovers 24``

Everything lives in one PostgreSQL database: the coordinator the writers
stand with (``stockade.connect(url)``), the fence and the shards' logs
(`stockade.resources.log`). The driver starts two writer candidates per
shard (`writer.py`: each campaigns with ``coord.elect``) and the storage nodes
(`node.py`), lets them run, and injects failovers one after the other,
cycling through ``--kinds`` (kill, pause, freeze by default):

- **kill**: the shard's writer is killed with SIGKILL; the driver starts a new
  candidate, and the candidate that was waiting is elected once the lease
  expires;
- **pause**: the writer is stopped with SIGSTOP, at whatever point it is, until
  another candidate leads the shard and has appended (or ``--pause-append-wait-s``:
  a writer paused inside an append holds the shard's lock until the database
  ends its transaction after ``--idle-transaction-ms``); then SIGCONT;
- **freeze**: the writer is told (``freeze TERM`` on its stdin) to stop itself
  with SIGSTOP between its check of ``lost`` and its next append, the worst
  moment; then as for a pause.

After a pause or a freeze the resumed writer sends its next append with its
old token (the writers never look at their leadership between that check and
the append, on purpose), and the driver waits until it steps down and says
what became of it: **refused** by the fence; **accepted** after the new
leader's first append (what the fence exists to prevent); or **not refused**
(it saw ``lost`` before appending again, or its append landed before the new
leader's first, which the fence rightly lets in).

The driver finds a shard's writer as a router would: it asks the coordinator
who leads (``coord.leader``, `router.leaders`), and after the failover it
watches for the next term (``coord.watch_leader``, `router.next_leader`).
It times each failover from the writer's death (the SIGKILL, the SIGSTOP, the
writer's ``frozen`` line) to the watch seeing the new leader (``elected_ms``)
and to the new leader's first acknowledged append (``failover_ms``), prints
who leads each shard after it (on stderr), and checks every leader it
observed against the writers' own events: the coordinator's holder of a term
must be the writer whose appends carry that term (``leader_mismatches``).

Then the writers are stopped, the nodes catch up and write their states, and
`check.check` judges the run. The exit status is 0 only if every count that
must be zero is zero (``leader_mismatches`` too), the nodes agree and every
shard is linearizable. ``--installed`` leaves the log and its fence as they
are in the database (the test's control installs a fence that accepts every
token, and the run must then fail).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
from check import check
from psycopg import sql
from router import leaders, next_leader, shard_name

import stockade
from stockade.client import LeaderInfo
from stockade.resources.log import open_postgres_log

HERE = Path(__file__).resolve().parent
EVENT_WAIT_S = 120.0
KINDS = ("kill", "pause", "freeze")
FREEZE_TRIES_MAX = 5
Event = tuple[str, str, int]  # process name, line, monotonic ns when the driver's reader got it


class Proc:
    """A child process whose stdout lines are events."""

    def __init__(self, argv: list[str], name: str, events: queue.Queue[Event]) -> None:
        self.name = name
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._pump, args=(events,), daemon=True).start()

    def _pump(self, events: queue.Queue[Event]) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            events.put((self.name, line.strip(), time.monotonic_ns()))
        events.put((self.name, "exit", time.monotonic_ns()))


class Driver:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.events: queue.Queue[Event] = queue.Queue()
        self.writers: dict[str, Proc] = {}
        self.shard_of: dict[str, str] = {}
        self.count = 0
        self.coord = stockade.connect(args.url)
        # What the writers said (their events):
        # Terms (token values) increase per shard; two shards may have the same one: all is kept per shard.
        self.term_writer: dict[str, dict[int, str]] = defaultdict(dict)  # shard -> term -> its writer
        self.terms_claimed_twice = 0
        self.first_ack: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)  # shard -> term -> (offset, ns)
        self.newest_acked: dict[str, int] = {}  # shard -> the greatest term acknowledged
        self.acks: dict[str, list[tuple[int, int]]] = defaultdict(list)  # writer -> (offset, term)
        self.refused: dict[str, int] = defaultdict(int)
        self.down: dict[tuple[str, int], str] = {}  # (writer, term) -> why it stepped down from that term
        # What the driver saw and measured:
        self.observed: dict[str, dict[int, str]] = defaultdict(dict)  # shard -> term -> the holder shown
        self.failovers = dict.fromkeys(KINDS, 0)
        self.failover_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}  # death -> new leader's first ack
        self.elected_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}  # death -> the watch saw it lead
        self.elected_ns = 0
        self.zombies = {kind: {"refused": 0, "accepted": 0, "not_refused": 0} for kind in ("pause", "freeze")}
        self.frozen_ns: dict[tuple[str, int], int] = {}  # (writer, term) -> when it said it froze

    def spawn_writer(self, shard: str) -> None:
        self.count += 1
        name = f"w{self.count}"
        argv = [sys.executable, str(HERE / "writer.py"), "--url", self.args.url, "--shard", shard,
                "--shards", str(self.args.shards), "--name", name, "--history", str(self.workdir / f"{name}.jsonl"),
                "--ttl-ms", str(self.args.ttl_ms), "--pace-ms", str(self.args.pace_ms)]
        self.writers[name] = Proc(argv, name, self.events)
        self.shard_of[name] = shard

    def claim(self, term: int, name: str) -> None:
        self.terms_claimed_twice += self.term_writer[self.shard_of[name]].setdefault(term, name) != name

    def handle(self, name: str, line: str, t_ns: int) -> None:
        kind, *fields = line.split()
        if kind == "lead":
            self.claim(int(fields[0]), name)
        elif kind == "ack":
            offset, term = int(fields[0]), int(fields[1])
            self.claim(term, name)
            self.acks[name].append((offset, term))
            shard = self.shard_of[name]
            self.first_ack[shard].setdefault(term, (offset, t_ns))
            self.newest_acked[shard] = max(self.newest_acked.get(shard, 0), term)
        elif kind == "refused":
            self.refused[name] += 1
        elif kind == "frozen":
            self.frozen_ns[(name, int(fields[0]))] = t_ns
        elif kind == "down":
            self.down.setdefault((name, int(fields[0])), fields[1])

    def wait_for(self, done: Any, timeout_s: float = EVENT_WAIT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self.handle(*self.events.get(timeout=min(left, 0.5)))
            except queue.Empty:
                pass
        return True

    def drain(self) -> None:
        while True:
            try:
                self.handle(*self.events.get_nowait())
            except queue.Empty:
                return

    def observe(self, leader: LeaderInfo | None) -> LeaderInfo | None:
        if leader is not None:
            self.observed[leader.name].setdefault(leader.term, leader.holder)
        return leader

    def current_writer(self, shard: str) -> LeaderInfo:
        """The shard's leader as the coordinator shows it, once it has appended under its term."""
        deadline = time.monotonic() + EVENT_WAIT_S
        while time.monotonic() < deadline:
            leader = self.observe(self.coord.leader(shard))
            if leader is None:
                self.wait_for(lambda: False, timeout_s=0.1)  # handle events meanwhile
                continue
            if self.wait_for(lambda term=leader.term: term in self.first_ack[shard], timeout_s=1.0):
                if self.writers[leader.holder].popen.poll() is None and (leader.holder, leader.term) not in self.down:
                    return leader
                self.wait_for(lambda: False, timeout_s=0.1)  # it stepped down or was killed: the lease lapses soon
        raise RuntimeError(f"{shard} has no leader that appended")

    def successor_ack(self, shard: str, after_term: int) -> tuple[int, int]:
        """(offset, ns) of the first acknowledged append of the first term after ``after_term``."""
        return self.first_ack[shard][min(t for t in self.first_ack[shard] if t > after_term)]

    def successor(self, shard: str, old: LeaderInfo) -> LeaderInfo:
        """Watch the coordinator until a later term leads ``shard``."""
        leader = self.observe(next_leader(self.coord, shard, after_term=old.term, timeout_ms=int(EVENT_WAIT_S * 1000)))
        if leader is None:
            raise RuntimeError(f"{shard}: no leader after {old.holder}'s term")
        self.elected_ns = time.monotonic_ns()
        return leader

    def failover(self, number: int, kind: str) -> None:
        """Inject one failover of ``kind`` on shard ``number mod shards``; a freeze the writer could not
        reach (it stepped down first) is tried again on the shard's next writer."""
        shard = shard_name(number % self.args.shards)
        for _ in range(FREEZE_TRIES_MAX):
            if self.fail(number, kind, shard):
                return
        raise RuntimeError(f"{shard}: no writer reached its freeze in {FREEZE_TRIES_MAX} tries")

    def fail(self, number: int, kind: str, shard: str) -> bool:
        old = self.current_writer(shard)
        proc = self.writers[old.holder]
        acks_before = len(self.acks[old.holder])
        stepped_down = lambda: (old.holder, old.term) in self.down  # noqa: E731
        acked_after_old = lambda: self.newest_acked.get(shard, 0) > old.term  # noqa: E731
        died_ns = time.monotonic_ns()
        if kind == "kill":
            proc.popen.send_signal(signal.SIGKILL)
            proc.popen.wait()
            self.spawn_writer(shard)
            new = self.successor(shard, old)
        else:
            if kind == "freeze":  # the writer stops itself in its gap (between its check of lost and its append)
                assert proc.popen.stdin is not None
                proc.popen.stdin.write(f"freeze {old.term}\n")
                proc.popen.stdin.flush()
                frozen = (old.holder, old.term)
                if not self.wait_for(lambda: frozen in self.frozen_ns or stepped_down()):
                    raise RuntimeError(f"{shard}: {old.holder} neither froze nor stepped down")
                if frozen not in self.frozen_ns:
                    return False
                died_ns = self.frozen_ns[frozen]
            else:
                proc.popen.send_signal(signal.SIGSTOP)
            try:
                new = self.successor(shard, old)
                self.wait_for(acked_after_old, timeout_s=self.args.pause_append_wait_s)
            finally:
                proc.popen.send_signal(signal.SIGCONT)
            if not self.wait_for(stepped_down):
                raise RuntimeError(f"{shard}: the resumed writer {old.holder} never stepped down")
        if not self.wait_for(acked_after_old):
            raise RuntimeError(f"{shard}: no append after {old.holder}'s term")
        outcome = "" if kind == "kill" else self.zombie_outcome(kind, old, acks_before)
        self.failovers[kind] += 1
        _, first_ack_ns = self.successor_ack(shard, old.term)
        elapsed_ms = (first_ack_ns - died_ns) / 1e6
        self.failover_ms[kind].append(elapsed_ms)
        self.elected_ms[kind].append((self.elected_ns - died_ns) / 1e6)
        now = leaders(self.coord, self.args.shards)  # who leads each shard, as the router sees it
        for leader in now.values():
            self.observe(leader)
        shown = " ".join(f"{s.rsplit('-', 1)[1]}={'-' if i is None else i.holder}" for s, i in now.items())
        print(f"failover {number + 1} {kind} {shard}: {old.holder} (term {old.term}) -> {new.holder} (term "
              f"{new.term}), first ack {elapsed_ms:.0f} ms after the death{outcome}; leaders {shown}",
              file=sys.stderr, flush=True)
        return True

    def zombie_outcome(self, kind: str, old: LeaderInfo, acks_before: int) -> str:
        """What became of the resumed writer's next append under its old term."""
        successor_offset, _ = self.successor_ack(old.name, old.term)
        acks = self.acks[old.holder][acks_before:]
        if any(term == old.term and offset > successor_offset for offset, term in acks):
            outcome = "accepted"  # after the new leader's first append: what the fence is for
        elif self.down[(old.holder, old.term)] == "refused":
            outcome = "refused"
        else:
            outcome = "not_refused"  # it saw lost first, or its append landed before the new leader's
        self.zombies[kind][outcome] += 1
        return f"; the resumed writer's next append: {outcome.replace('_', ' ')}"

    def prepare(self) -> None:
        if not self.args.installed:
            open_postgres_log(self.args.url, keys=self.coord.verify_keys(), install=True).close()
        with psycopg.connect(self.args.url, autocommit=True) as conn:
            # A writer stopped inside a transaction (an append, or its coordinator's renewal) would hold
            # that transaction's locks for as long as it is stopped: the server ends such a transaction.
            name = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                sql.Identifier(name), sql.Literal(f"{self.args.idle_transaction_ms}ms")))

    def run(self) -> dict[str, Any]:
        self.prepare()
        nodes = []
        for i in range(self.args.nodes):
            name = f"n{i}"
            argv = [sys.executable, str(HERE / "node.py"), "--url", self.args.url, "--shards", str(self.args.shards),
                    "--name", name, "--history", str(self.workdir / f"{name}.jsonl"),
                    "--out", str(self.workdir / f"{name}.json")]
            nodes.append(Proc(argv, name, queue.Queue()))
        for i in range(self.args.shards):
            for _ in range(2):
                self.spawn_writer(shard_name(i))
        kinds = self.args.kinds.split(",")
        started = time.monotonic()
        try:
            for number in range(self.args.failovers):
                self.failover(number, kinds[number % len(kinds)])
            self.wait_for(lambda: time.monotonic() - started >= self.args.seconds, timeout_s=self.args.seconds + 1)
        finally:
            self.stop(nodes)
        self.drain()
        self.coord.close()
        records: list[dict[str, Any]] = []
        for path in sorted(self.workdir.glob("*.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        states = [json.loads((self.workdir / f"n{i}.json").read_text()) for i in range(self.args.nodes)]
        report = check(self.args.url, self.args.shards, records, states)
        report.update(self.election_report(), failovers=self.failovers, writers_started=self.count,
                      seconds=round(time.monotonic() - started, 1))
        return report

    def election_report(self) -> dict[str, Any]:
        def summary(values: list[float]) -> dict[str, float]:
            return {"n": len(values), "median": round(statistics.median(values)), "min": round(min(values)),
                    "max": round(max(values))} if values else {"n": 0}

        return {
            "failover_ms": {kind: summary(values) for kind, values in self.failover_ms.items()},
            "elected_ms": {kind: summary(values) for kind, values in self.elected_ms.items()},
            "zombie_appends": self.zombies,
            "leaders_observed": sum(len(terms) for terms in self.observed.values()),
            "leader_mismatches": self.terms_claimed_twice + sum(
                self.term_writer[shard].get(term, holder) != holder
                for shard, terms in self.observed.items() for term, holder in terms.items()),
            "leaders_unconfirmed": sum(term not in self.term_writer[shard]
                                       for shard, terms in self.observed.items() for term in terms),
        }

    def stop(self, nodes: list[Proc]) -> None:
        for proc in self.writers.values():
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)
                proc.popen.terminate()
        for proc in self.writers.values():
            try:
                proc.popen.wait(60)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        for proc in nodes:
            assert proc.popen.stdin is not None
            proc.popen.stdin.write("stop\n")
            proc.popen.stdin.flush()
        for proc in nodes:
            try:
                proc.popen.wait(120)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()


def passed(report: dict[str, Any]) -> bool:
    zero = ("acknowledged_lost", "duplicated", "gaps", "out_of_order", "stale_accepted", "leader_mismatches")
    return (all(report[name] == 0 for name in zero) and report["node_digests"] == 1
            and report["nodes_match_logs"] == report["nodes"] and report["linearizable"]
            and not report["linearizability_undecided"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="postgresql://... (coordinator, fence and logs)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=24)
    parser.add_argument("--kinds", default=",".join(KINDS), help="the failovers' kinds, in turn")
    parser.add_argument("--installed", action="store_true",
                        help="the log and its fence are installed already: do not (re)install them")
    parser.add_argument("--seconds", type=float, default=0.0, help="run at least this long")
    parser.add_argument("--ttl-ms", type=int, default=1_000)
    parser.add_argument("--pace-ms", type=float, default=20.0, help="mean pause between a writer's appends")
    parser.add_argument("--pause-append-wait-s", type=float, default=3.0)
    parser.add_argument("--idle-transaction-ms", type=int, default=2_000,
                        help="the database ends a transaction idle this long (a stopped writer's)")
    parser.add_argument("--workdir", help="where histories and node states go (default: a temporary directory)")
    args = parser.parse_args()
    if not set(args.kinds.split(",")) <= set(KINDS):
        parser.error(f"--kinds: {', '.join(KINDS)} only, got {args.kinds!r}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shardkv-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = Driver(args, workdir).run()
    report["passed"] = passed(report)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
