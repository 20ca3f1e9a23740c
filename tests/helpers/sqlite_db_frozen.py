"""A writer process frozen inside `stockade.resources.sqlite_db.fenced` (tests/test_fence_sqlite_frozen.py).

``sqlite_db_frozen.py PATH KEYRING``
    For each line ``TOKEN`` on stdin (an encoded token): open a fenced
    transaction on the user's file at PATH under TOKEN, write one row of its
    own table, print ``frozen VALUE`` and stop itself with SIGSTOP, inside the
    transaction (holding SQLite's write lock). On SIGCONT the block ends: print
    ``committed VALUE``, or ``failed KIND`` if the commit was refused.
"""

import os
import signal
import sqlite3
import sys

from stockade.core.errors import StockadeError
from stockade.core.tokens import FencingToken
from stockade.resources.sqlite_db import fenced
from stockade.testing.fences.sqlite_db import UPSERT

path, keyring = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(path, isolation_level=None)
for line in sys.stdin:
    token = FencingToken.decode(line.strip())
    try:
        with fenced(conn, token, keys=keyring, cluster_id=token.cluster):
            conn.execute(UPSERT, (token.scope, f"frozen-{token.value}", b"x"))
            print(f"frozen {token.value}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        print(f"committed {token.value}", flush=True)
    except StockadeError as exc:
        print(f"failed {type(exc).__name__}", flush=True)
