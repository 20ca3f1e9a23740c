"""A storage node of the sharded key-value example: applies each shard's log, in offset order.

``node.py --url URL --shards 8 --name n0 --history PATH --out PATH``

The node tails every shard's fenced log from the offset it has applied and
applies each entry (a put) to its own copy of the shard. An entry whose
offset is not the next one is counted as out of order (it never happens: the
log has no gap and a read returns entries in offset order).

It also serves reads, and records them in the history: a read first learns
the shard's next offset, applies the log through it, then answers from its
copy, so it sees every append acknowledged before the read began
(linearizable, as a read that waits for the leader's commit index).

On a line ``stop`` on stdin it catches up with every shard's log, writes its
state and counters to ``--out`` (JSON) and exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import threading
import time
from typing import Any

from router import keys_of, shard_name

from stockade.resources.log import open_postgres_log

READ_LIMIT = 500


class Node:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shards = [shard_name(i) for i in range(args.shards)]
        self.log = open_postgres_log(args.url, keys="unsigned", install=False)  # a reader verifies no token
        self.applied = dict.fromkeys(self.shards, 0)
        self.state: dict[str, dict[str, str]] = {s: {} for s in self.shards}
        self.out_of_order = 0
        self.entries = 0
        self.history = open(args.history, "a", buffering=1)  # held for the process's life
        self.rng = random.Random(args.name)
        self.stop = threading.Event()

    def pull(self, shard: str, wait_ms: int = 0) -> int:
        """Apply what the shard's log holds past our offset (one page); how many entries."""
        entries = self.log.read(shard, self.applied[shard], READ_LIMIT, wait_ms=wait_ms)
        for entry in entries:
            if entry.offset != self.applied[shard]:
                self.out_of_order += 1
                break
            operation = json.loads(entry.data)
            self.state[shard][operation["k"]] = operation["v"]
            self.applied[shard] = entry.offset + 1
            self.entries += 1
        return len(entries)

    def catch_up(self, shard: str, head: int) -> None:
        while self.applied[shard] < head:
            if self.pull(shard, wait_ms=1_000) == 0 and self.out_of_order:
                return

    def read(self) -> None:
        shard = self.rng.choice(self.shards)
        keys = keys_of(shard, self.args.shards)
        if not keys:
            return
        key = self.rng.choice(keys)
        fields = {"f": "read", "scope": shard, "key": key}
        self.record("invoke", **fields)
        self.catch_up(shard, self.log.next_offset(shard))
        self.record("ok", **fields, value=self.state[shard].get(key))

    def record(self, kind: str, **fields: Any) -> None:
        self.history.write(json.dumps({"t_ns": time.monotonic_ns(), "process": self.args.name, "type": kind,
                                       **fields}) + "\n")

    def run(self) -> None:
        threading.Thread(target=self._watch_stdin, daemon=True).start()
        last_read = 0.0
        while not self.stop.is_set():
            moved = sum(self.pull(shard) for shard in self.shards)
            if time.monotonic() - last_read >= self.args.read_every_ms / 1000:
                self.read()
                last_read = time.monotonic()
            if not moved:
                self.pull(self.rng.choice(self.shards), wait_ms=20)
        for shard in self.shards:
            self.catch_up(shard, self.log.next_offset(shard))
        canonical = json.dumps({"applied": self.applied, "state": self.state}, sort_keys=True).encode()
        with open(self.args.out, "w") as out:
            json.dump({"name": self.args.name, "digest": hashlib.sha256(canonical).hexdigest(),
                       "applied": self.applied, "entries": self.entries, "out_of_order": self.out_of_order,
                       "state": self.state}, out)
        print("done", flush=True)

    def _watch_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        self.stop.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--read-every-ms", type=float, default=30.0)
    Node(parser.parse_args()).run()


if __name__ == "__main__":
    main()
