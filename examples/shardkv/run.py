"""Run the sharded key-value example with writer failovers, then check it (prints a JSON report).

``python examples/shardkv/run.py --url postgresql://user@host:5432/db --shards 8 --nodes 3 --failovers 6``

Everything lives in one PostgreSQL database: the lease coordinator
(``stockade.connect(url)``), the fence and the shards' logs
(`stockade.resources.log`). The driver starts two writer candidates per
shard (`writer.py`) and the storage nodes (`node.py`), lets them run, and
injects failovers one after the other, alternating between two kinds:

- **kill**: the shard's writer is killed with SIGKILL; the driver starts a new
  candidate and waits until another candidate leads the shard;
- **pause**: the writer is stopped with SIGSTOP until its lease has expired and
  another candidate leads the shard and has appended (or a few seconds: a writer
  paused inside a transaction holds its locks until the database ends that
  transaction after ``--idle-transaction-ms``); then SIGCONT.
  The resumed writer's next append carries its old token; the driver waits
  until the log refuses it.

Then the writers are stopped, the nodes catch up and write their states, and
`check.check` judges the run. The exit status is 0 only if every count that
must be zero is zero, the nodes agree and every shard is linearizable.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from check import check
from psycopg import sql
from router import shard_name

import stockade
from stockade.resources.log import open_postgres_log

HERE = Path(__file__).resolve().parent
EVENT_WAIT_S = 120.0


class Proc:
    """A child process whose stdout lines are events."""

    def __init__(self, argv: list[str], name: str, events: queue.Queue[tuple[str, str]]) -> None:
        self.name = name
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        threading.Thread(target=self._pump, args=(events,), daemon=True).start()

    def _pump(self, events: queue.Queue[tuple[str, str]]) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.strip())
            events.put((self.name, line.strip()))
        events.put((self.name, "exit"))


class Driver:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()
        self.writers: dict[str, Proc] = {}
        self.shard_of: dict[str, str] = {}
        self.leader: dict[str, tuple[int, str]] = {}  # shard -> (token, writer name)
        self.acks: dict[str, int] = {}
        self.acked_token: dict[str, int] = {}  # writer -> the token of its last acknowledged append
        self.refused: dict[str, int] = {}
        self.count = 0
        self.failovers = {"kill": 0, "pause": 0}

    def spawn_writer(self, shard: str) -> None:
        self.count += 1
        name = f"w{self.count}"
        argv = [sys.executable, str(HERE / "writer.py"), "--url", self.args.url, "--shard", shard,
                "--shards", str(self.args.shards), "--name", name, "--history", str(self.workdir / f"{name}.jsonl"),
                "--ttl-ms", str(self.args.ttl_ms), "--pace-ms", str(self.args.pace_ms)]
        self.writers[name] = Proc(argv, name, self.events)
        self.shard_of[name] = shard

    def handle(self, name: str, line: str) -> None:
        kind, _, value = line.partition(" ")
        if kind == "lead":
            shard = self.shard_of[name]
            if int(value) > self.leader.get(shard, (0, ""))[0]:
                self.leader[shard] = (int(value), name)
        elif kind == "ack":
            self.acks[name] = self.acks.get(name, 0) + 1
            self.acked_token[name] = int(value.split()[1])
        elif kind == "refused":
            self.refused[name] = self.refused.get(name, 0) + 1

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

    def failover(self, number: int) -> None:
        shard = shard_name(number % self.args.shards)
        def settled() -> bool:  # the newest leader has appended under its token: every other candidate waits
            return shard in self.leader and self.acked_token.get(self.leader[shard][1]) == self.leader[shard][0]

        if not self.wait_for(settled):
            raise RuntimeError(f"{shard} has no writer that appended")
        token, old = self.leader[shard]
        process = self.writers[old].popen
        new_leader = lambda: self.leader[shard][0] > token  # noqa: E731
        if number % 2 == 0:
            process.send_signal(signal.SIGKILL)
            process.wait()
            self.failovers["kill"] += 1
            self.spawn_writer(shard)
            if not self.wait_for(new_leader):
                raise RuntimeError(f"{shard}: no new writer after a kill")
            return
        refused_before = self.refused.get(old, 0)
        process.send_signal(signal.SIGSTOP)
        self.failovers["pause"] += 1
        try:
            if not self.wait_for(new_leader):
                raise RuntimeError(f"{shard}: no new writer while the old one was paused")
            newcomer = self.leader[shard][1]
            acks = self.acks.get(newcomer, 0)
            self.wait_for(lambda: self.acks.get(newcomer, 0) > acks, timeout_s=self.args.pause_append_wait_s)
        finally:
            process.send_signal(signal.SIGCONT)
        if not self.wait_for(lambda: self.refused.get(old, 0) > refused_before):
            raise RuntimeError(f"{shard}: the resumed writer {old} was never refused")

    def run(self) -> dict[str, Any]:
        coord = stockade.connect(self.args.url)
        open_postgres_log(self.args.url, keys=coord.verify_keys(), install=True).close()
        coord.close()
        with psycopg.connect(self.args.url, autocommit=True) as conn:
            # A writer stopped inside a transaction (an append, or its coordinator's renewal) would hold
            # that transaction's locks for as long as it is stopped: the server ends such a transaction.
            name = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                sql.Identifier(name), sql.Literal(f"{self.args.idle_transaction_ms}ms")))
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
        started = time.monotonic()
        try:
            for number in range(self.args.failovers):
                self.failover(number)
            self.wait_for(lambda: time.monotonic() - started >= self.args.seconds, timeout_s=self.args.seconds + 1)
        finally:
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
        self.drain()
        records: list[dict[str, Any]] = []
        for path in sorted(self.workdir.glob("*.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        states = [json.loads((self.workdir / f"n{i}.json").read_text()) for i in range(self.args.nodes)]
        report = check(self.args.url, self.args.shards, records, states)
        report.update(failovers=self.failovers, writers_started=self.count,
                      seconds=round(time.monotonic() - started, 1))
        return report


def passed(report: dict[str, Any]) -> bool:
    zero = ("acknowledged_lost", "duplicated", "gaps", "out_of_order", "stale_accepted")
    return (all(report[name] == 0 for name in zero) and report["node_digests"] == 1
            and report["nodes_match_logs"] == report["nodes"] and report["linearizable"]
            and not report["linearizability_undecided"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="postgresql://... (coordinator, fence and logs)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=0.0, help="run at least this long")
    parser.add_argument("--ttl-ms", type=int, default=1_000)
    parser.add_argument("--pace-ms", type=float, default=20.0, help="mean pause between a writer's appends")
    parser.add_argument("--pause-append-wait-s", type=float, default=3.0)
    parser.add_argument("--idle-transaction-ms", type=int, default=2_000,
                        help="the database ends a transaction idle this long (a stopped writer's)")
    parser.add_argument("--workdir", help="where histories and node states go (default: a temporary directory)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shardkv-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = Driver(args, workdir).run()
    report["passed"] = passed(report)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
