"""A writer that the retry test kills with SIGKILL around its commits, and restarts (tests/test_fence_retry_kill.py).

``retry_writer.py KIND TARGET TOKEN KEYRING JOURNAL OPS OP_IDS``: KIND is
``postgres`` (TARGET a dsn) or ``sqlite`` (TARGET a file); TOKEN the encoded
token it writes with, every time; KEYRING the keyring file that verifies it;
JOURNAL its own record of what it began and what it knows committed.

Operation ``i`` inserts one row ``(i)`` into ``applied`` in a fenced
transaction, with the operation id ``op-i`` when OP_IDS is 1. Before it, the
writer appends ``begin i`` to its journal (fsync'd); after the transaction
returned (committed, or `AlreadyApplied`), ``done i``. Started again after a
kill, it retries the operation it began and never saw end, with the same
token and the same id (its outcome is unknown: the kill may have come before,
during or after the commit), then goes on. It prints ``commit i`` just before
each commit and ``committed i`` once the commit returned (before ``done i`` is
recorded), and after each waits for a line on stdin, so that the test, which reads every line
before it answers, can kill it around the commit however far behind a busy machine puts it.
"""

import os
import sqlite3
import sys

import psycopg

from stockade.core.errors import AlreadyApplied
from stockade.keys import KeyFile
from stockade.resources import postgres, sqlite_db

kind, target, token, keyring, journal_path, ops, op_ids = sys.argv[1:8]


def journal(line: str) -> None:
    with open(journal_path, "a") as journal_file:
        journal_file.write(line + "\n")
        journal_file.flush()
        os.fsync(journal_file.fileno())


begun, done = -1, -1
if os.path.exists(journal_path):
    for word, number in (line.split() for line in open(journal_path).read().splitlines() if line.count(" ") == 1):
        if word == "begin":
            begun = max(begun, int(number))
        else:
            done = max(done, int(number))

if kind == "postgres":
    conn = psycopg.connect(target, autocommit=True)

    def fenced(op_id: str | None):
        return postgres.fenced(conn, token, op_id=op_id)

    insert = "INSERT INTO applied (op) VALUES (%s)"
else:
    conn = sqlite3.connect(target, isolation_level=None, timeout=30)
    keys = KeyFile(keyring)

    def fenced(op_id: str | None):
        return sqlite_db.fenced(conn, token, keys=keys, op_id=op_id)

    insert = "INSERT INTO applied (op) VALUES (?)"



def tell(line: str) -> None:
    """Print ``line`` and wait for the test's go-ahead (it may kill this process instead)."""
    print(line, flush=True)
    sys.stdin.readline()


first = done + 1 if begun <= done else begun  # the retry of the one begun and never seen to end, or the next
for i in range(first, int(ops)):
    if i > begun:
        journal(f"begin {i}")
    try:
        with fenced(f"op-{i}" if op_ids == "1" else None):
            conn.execute(insert, (i,))
            tell(f"commit {i}")
        tell(f"committed {i}")
    except AlreadyApplied:
        pass
    journal(f"done {i}")
print("finished", flush=True)
