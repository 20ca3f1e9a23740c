"""One writer candidate of one shard: leads it while it holds the shard's lease, and appends to its log.

``writer.py --url URL --shard kv.shard-3 --shards 8 --name w7 --history PATH``

Candidates of a shard wait for the shard's lease (``coord.acquire`` on the
shard's scope); the holder is the shard's writer. Its first append under a new
lease is a ``_leader`` entry (as a newly elected leader's first act), which
raises the shard's high-water mark to its token before it retries anything.
Then it appends ``put`` operations of random keys of the shard, each with an
idempotency key (its value), and retries an append whose outcome is unknown
with the same key.

On purpose, it never consults its lease's local deadline before an append: a
writer paused past its lease (a zombie) tries its next append anyway, and only
the shard log's fence stands in its way. A refused append (`StaleToken`) ends
its leadership; it waits for the lease again.

Each operation is recorded in the history file (JSON lines: invoke, then
ok / fail / info) and events are printed on stdout for the driver:
``lead TOKEN``, ``ack OFFSET TOKEN``, ``refused TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from typing import Any

from router import keys_of

import stockade
from stockade.core.errors import BackendUnavailable, LeaseError, StaleToken
from stockade.resources.log import open_postgres_log

RETRIES_MAX = 5


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

    def record(self, kind: str, **fields: Any) -> None:
        self.history.write(json.dumps({"t_ns": time.monotonic_ns(), "process": self.name, "type": kind,
                                       **fields}) + "\n")

    def event(self, text: str) -> None:
        print(text, flush=True)

    def run(self) -> None:
        while not self.stopping:
            try:
                lease = self.coord.acquire(self.shard, ttl_ms=self.args.ttl_ms, wait_ms=2_000, holder=self.name)
            except LeaseError:
                continue  # LockTimeout: wait again
            except BackendUnavailable:
                time.sleep(0.1)  # the coordinator's database failed or timed out: try again
                continue
            self.event(f"lead {lease.token.value}")
            try:
                if self.append(lease, "_leader", f"{self.name}:{lease.token.value}"):
                    while not self.stopping:
                        key = self.rng.choice(self.keys)
                        self.seq += 1
                        if not self.append(lease, key, f"{self.name}-{self.seq}"):
                            break
                        time.sleep(self.rng.uniform(0, 2 * self.args.pace_ms) / 1000)
            finally:
                try:
                    lease.release()
                except stockade.StockadeError:
                    pass  # lost or expired: a newer writer holds the shard

    def append(self, lease: Any, key: str, value: str) -> bool:
        """Append one put; True while this writer still leads."""
        token = lease.token
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
                return False
            except BackendUnavailable as lost:
                self.record("info", **fields, error=str(lost)[:200])
                time.sleep(0.05)
                continue  # the same idempotency key: appended at most once
            # A replay's entry landed earlier, under the first try: in the history it stays unknown in time.
            self.record("info" if result.replayed else "ok", **fields, offset=result.first_offset,
                        replayed=result.replayed)
            self.event(f"ack {result.first_offset} {token.value}")
            return True
        return False


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
