"""Writer processes of the shard-log tests (tests/test_shard_log.py), one mode per test.

``shardlog_writer.py handoff URL SHARD ROUNDS APPENDS NAME``
    Each round: wait for the shard's lease (the PostgreSQL coordinator in the
    same database, TTL 5 s), append APPENDS entries one by one (idempotency key
    ``NAME-round-i``), release. Prints ``ack OFFSET VALUE`` per acknowledged append.

``shardlog_writer.py zombie URL SHARD ROUNDS COORD_URL``
    Each round: acquire the shard from the coordinator at COORD_URL (TTL 300 ms, keepalive on), print ``held
    TOKEN``, wait for a line on stdin (the test paused and resumed it
    meanwhile, past its lease), append under the old token and print
    ``accepted`` or ``rejected``.

``shardlog_writer.py batches URL SHARD TOKEN PREFIX BATCH_ENTRIES ENTRY_BYTES``
    Append batches forever under TOKEN (an encoded token) to URL (``postgresql://...``
    or ``sqlite:///path`` of a store file): prints ``begin BATCH`` before each
    append and ``ack BATCH FIRST_OFFSET`` after it. Each entry is ``PREFIX-batch
    i/n`` padded to ENTRY_BYTES.

The PostgreSQL log is opened with ``keys="unsigned"``: the database checks every
MAC with its own copy of the keys, so the test's keys never leave its process.
The store file is opened with no keys: its process checks no MAC (the test
checks what landed).
"""

import sys

import stockade
from stockade.core.errors import LeaseError, StaleToken
from stockade.resources.log import SQLiteShardLog, open_postgres_log

mode, url, shard = sys.argv[1], sys.argv[2], sys.argv[3]
if url.startswith("sqlite://"):  # the store file; it checks no MAC here (the test's keys stay in the test)
    log = SQLiteShardLog(url.removeprefix("sqlite://"))
else:
    log = open_postgres_log(url, keys="unsigned", install=False)

if mode == "handoff":
    rounds, appends, name = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    coord = stockade.connect(url)
    for round_ in range(rounds):
        lease = coord.acquire(shard, ttl_ms=5_000, wait_ms=120_000, holder=name)
        for i in range(appends):
            value = f"{name}-{round_}-{i}"
            result = log.append(shard, value.encode(), token=lease.token, idempotency_key=value)
            print(f"ack {result.first_offset} {value}", flush=True)
        try:
            lease.release()
        except LeaseError:
            pass
elif mode == "zombie":
    rounds = int(sys.argv[4])
    coord = stockade.connect(sys.argv[5])
    for _ in range(rounds):
        lease = coord.acquire(shard, ttl_ms=300, wait_ms=120_000)
        print(f"held {lease.token.value}", flush=True)
        sys.stdin.readline()
        try:
            log.append(shard, b"zombie", token=lease.token)
            print("accepted", flush=True)
        except StaleToken:
            print("rejected", flush=True)
        try:
            lease.release()
        except LeaseError:
            pass
elif mode == "batches":
    token, prefix, count, size = sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    batch = 0
    while True:
        batch += 1
        name = f"{prefix}-{batch}"
        entries = [f"{name} {i}/{count} ".encode().ljust(size, b".") for i in range(count)]
        print(f"begin {name}", flush=True)
        result = log.append_batch(shard, entries, token=token, idempotency_key=name)
        print(f"ack {name} {result.first_offset}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode}")
