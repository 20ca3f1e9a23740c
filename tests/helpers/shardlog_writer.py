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

``shardlog_writer.py pause-in-append URL SHARD TOKEN [control]``
    Append one batch under TOKEN to the PostgreSQL log at URL, and stop itself
    with SIGSTOP right after the entries' insert, before the COMMIT; on SIGCONT
    print ``accepted`` or ``failed KIND``. With ``control`` the entries go in
    with ``executemany`` (psycopg's pipeline), as appends did before.

``shardlog_writer.py freeze-in-append URL SHARD TOKEN``
    For each line on stdin: append one entry under TOKEN to the store file at URL
    (opened with its recorded partitions) and stop itself with SIGSTOP inside the
    append's write transaction (after BEGIN IMMEDIATE and the mark's update,
    before the entry and the COMMIT), printing ``frozen N`` first; on SIGCONT it
    commits and prints ``ack N OFFSET``.

The PostgreSQL log is opened with ``keys="unsigned"``: the database checks every
MAC with its own copy of the keys, so the test's keys never leave its process.
The store file is opened with the keyring the test left beside it
(``log.keys``), or, where there is none, with ``keys="unsigned"``: that
process checks no MAC (the test checks what landed).
"""

import sys

import stockade
from stockade.core.errors import LeaseError, StaleToken, StockadeError
from stockade.recipes.log import SQLiteShardLog, open_postgres_log
from stockade.transport.sqlite_url import sqlite_path

mode, url, shard = sys.argv[1], sys.argv[2], sys.argv[3]
if url.startswith("sqlite://"):  # the store file; it checks no MAC here (the test's keys stay in the test)
    path = sqlite_path(url)
    keyring = path.with_suffix(".keys")
    log = SQLiteShardLog(path, keys=str(keyring) if keyring.exists() else "unsigned")
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
elif mode == "pause-in-append":
    import os
    import signal

    import psycopg

    token, control = sys.argv[4], sys.argv[5:] == ["control"]
    execute = psycopg.Connection.execute

    def pause_before_the_head(self, query, params=None, **kwargs):  # the entries are in, the COMMIT not sent
        if isinstance(query, str) and query.startswith("UPDATE") and ".heads SET next_offset" in query:
            print("paused", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if control and isinstance(query, str) and "unnest(" in query:  # the bug put back: executemany
            shard_, first, value, key, count, print_, entries = params
            table = query.split()[2]
            with self.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} (shard, log_offset, token_value, data, idempotency_key, "
                                "batch_count, fingerprint) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                                [(shard_, first + i, value, entry, key if i == 0 else None,
                                  count if i == 0 else None, print_ if i == 0 else None)
                                 for i, entry in enumerate(entries)])
            # The Flush that psycopg's pipeline may send after its Sync, sent here every time: whether
            # psycopg's own reaches the server after the Sync is a race (it did in 3 of 7 runs).
            self.pgconn.send_flush_request()
            self.pgconn.flush()
            return None
        return execute(self, query, params, **kwargs)

    psycopg.Connection.execute = pause_before_the_head
    try:
        log.append_batch(shard, [b"paused-1", b"paused-2"], token=token)
        print("accepted", flush=True)
    except StockadeError as exc:  # the server ended the transaction: the outcome is reported, not raised
        print(f"failed {type(exc).__name__}", flush=True)
elif mode == "freeze-in-append":
    import os
    import signal

    token, raise_mark, round_ = sys.argv[4], SQLiteShardLog._raise_high_water, 0

    def freeze_holding_the_lock(self, conn, scope, old, new):  # inside BEGIN IMMEDIATE: the file's write lock
        raise_mark(self, conn, scope, old, new)
        print(f"frozen {round_}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    SQLiteShardLog._raise_high_water = freeze_holding_the_lock
    while sys.stdin.readline():
        round_ += 1
        result = log.append(shard, f"frozen-writer {round_}".encode(), token=token)
        print(f"ack {round_} {result.first_offset}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode}")
