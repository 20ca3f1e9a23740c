"""One writer candidate of one shard: it campaigns with ``coord.elect`` and, while it leads, appends to the shard's log.

``writer.py --url URL --shard kv.shard-3 --shards 8 --name w7 --history PATH``

Candidates of a shard stand in the shard's election (``coord.elect(shard,
identity=NAME)``, first in, first out); the leader is the shard's writer, and
its name is what ``coord.leader(shard)`` shows (`router.leaders`). Every
append carries the leadership's token (its term). The first append of a term
is a ``_leader`` entry (as a newly elected leader's first act): it raises the
shard's high-water mark to the term before anything else, so no append of an
earlier term gets in after it. Then it appends ``put`` operations of random
keys of the shard, each with an idempotency key (its value), and retries an
append whose outcome is unknown with the same key.

A writer steps down, resigns and campaigns again when it sees its leadership
``lost`` (checked after each acknowledged append, before the short wait that
paces its appends), when an append is refused (`StaleToken`: a later term has
appended), or when an append stays unknown after ``RETRIES_MAX`` tries.

**The zombie is deliberate.** Nothing looks at the leadership between that
check and the next append: a writer frozen anywhere in between (SIGSTOP, as a
GC pause or a stopped VM would freeze it) for longer than its lease sends its
next append anyway when it wakes, with its old token. No check in the writer
could close that gap (the freeze may come right after any check), and the
example keeps it open on purpose, so that its runs show what does close it:
the shard log's fence refuses the append once the next term has appended.

A line ``freeze TERM`` on stdin (from the driver) makes the writer, if it
leads in TERM, stop itself with SIGSTOP at exactly that gap, right after
finding its leadership not lost: the zombie's worst moment, on demand. The
driver continues it with SIGCONT once the next term has appended.

Each operation is recorded in the history file (JSON lines: invoke, then
ok / fail / info) and events are printed on stdout for the driver:
``lead TERM``, ``ack OFFSET TERM``, ``refused TERM``, ``frozen TERM``,
``down TERM CAUSE`` (CAUSE: ``lost``, ``refused``, ``unknown``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from router import keys_of

import stockade
from stockade.client import Leadership
from stockade.core.errors import BackendUnavailable, LeaseError, StaleToken
from stockade.resources.log import open_postgres_log

RETRIES_MAX = 5
CAMPAIGN_WAIT_MS = 2_000  # one elect call waits this long, then the candidate stands again (a stop is seen)


class Writer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name
        self.shard = args.shard
        self.keys = keys_of(args.shard, args.shards)
        self.history = open(args.history, "a", buffering=1)  # held for the process's life
        self.coord = stockade.connect(args.url)
        self.log = open_postgres_log(args.url, keys=self.coord.verify_keys(), install=False)
        self.stopping = False
        self.seq = 0
        self.rng = random.Random(args.name)
        self.freeze_term = 0  # set by a "freeze TERM" line on stdin
        threading.Thread(target=self._read_commands, daemon=True).start()

    def record(self, kind: str, **fields: Any) -> None:
        self.history.write(json.dumps({"t_ns": time.monotonic_ns(), "process": self.name, "type": kind,
                                       **fields}) + "\n")

    def event(self, text: str) -> None:
        print(text, flush=True)

    def _read_commands(self) -> None:
        for line in sys.stdin:
            command, _, term = line.strip().partition(" ")
            if command == "freeze":
                self.freeze_term = int(term)

    def run(self) -> None:
        while not self.stopping:
            try:
                leadership = self.coord.elect(self.shard, ttl_ms=self.args.ttl_ms, wait_ms=CAMPAIGN_WAIT_MS,
                                              identity=self.name)
            except LeaseError:
                continue  # LockTimeout: another candidate still leads; stand again
            except BackendUnavailable:
                time.sleep(0.1)  # the coordinator's database failed or timed out: stand again
                continue
            self.event(f"lead {leadership.term}")
            try:
                cause = self.lead(leadership)
                if cause:
                    self.event(f"down {leadership.term} {cause}")
            finally:
                try:
                    leadership.resign()
                except stockade.StockadeError:
                    pass  # lost or expired: a newer term holds the shard

    def lead(self, leadership: Leadership) -> str:
        """Append while this term leads; why it stepped down ("" when stopping)."""
        outcome = self.append(leadership, "_leader", f"{self.name}:{leadership.term}")
        while outcome == "ok" and not self.stopping:
            if leadership.lost:
                return "lost"
            if self.freeze_term == leadership.term:  # the driver's "freeze": stop right in the gap below
                self.event(f"frozen {leadership.term}")
                os.kill(os.getpid(), signal.SIGSTOP)
            # From here to the append nothing looks at the leadership: a writer frozen in between
            # appends with its old term when it wakes (the zombie), and only the log's fence stops it.
            time.sleep(self.rng.uniform(0, 2 * self.args.pace_ms) / 1000)
            self.seq += 1
            outcome = self.append(leadership, self.rng.choice(self.keys), f"{self.name}-{self.seq}")
        return "" if outcome == "ok" else outcome

    def append(self, leadership: Leadership, key: str, value: str) -> str:
        """Append one put with the term's token: "ok", "refused" (a newer term appended) or "unknown"."""
        token = leadership.token
        data = json.dumps({"k": key, "v": value}).encode()
        for _ in range(RETRIES_MAX):
            fields = {"f": "write", "scope": self.shard, "token": token.value, "key": key, "value": value,
                      "idempotency_key": value}
            self.record("invoke", **fields)
            try:
                result = self.log.append(self.shard, data, token=token, idempotency_key=value)
            except StaleToken as refused:
                self.record("fail", **fields, error="stale-token", high_water=refused.high_water)
                self.event(f"refused {token.value}")
                return "refused"
            except BackendUnavailable as lost:
                self.record("info", **fields, error=str(lost)[:200])
                time.sleep(0.05)
                continue  # the same idempotency key: appended at most once
            # A replay's entry landed earlier, under the first try: in the history it stays unknown in time.
            self.record("info" if result.replayed else "ok", **fields, offset=result.first_offset,
                        replayed=result.replayed)
            self.event(f"ack {result.first_offset} {token.value}")
            return "ok"
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--shard", required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--ttl-ms", type=int, default=1_000)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    writer = Writer(parser.parse_args())

    def stop(*_: object) -> None:
        writer.stopping = True

    signal.signal(signal.SIGTERM, stop)
    writer.run()
    sys.exit(0)


if __name__ == "__main__":
    main()
