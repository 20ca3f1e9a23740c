"""An acquire storm against one coordinator file; killed with -9 by the S11 test.

Prints ``invoke SCOPE`` before each acquire and ``ok SCOPE TOKEN`` after the
reply, flushed, so that the test knows which grants were acknowledged and
which were in flight when the process died.

``storm.py URL SEED lazy-counter`` is the control: it reports tokens from a
counter that is saved only every 8th grant (tokens not durable across a
crash), which the S11 checks must catch.
"""

import os
import random
import sys
import threading
from pathlib import Path

import stockade
from stockade.transport.sqlite_url import sqlite_path

url, seed = sys.argv[1], int(sys.argv[2])
mutant = sys.argv[3] if len(sys.argv) > 3 else ""


def connect():
    """The coordinator, opened again while its file stayed locked past the busy timeout with nothing done (the
    round's two workers open it at once; at a load of 60 one of them waited out the 5 s busy timeout)."""
    for attempt in range(12):
        try:
            return stockade.connect(url)
        except stockade.BackendUnavailable as exc:
            if not exc.certain_no_effect or attempt == 11:
                raise


coord = connect()
lock = threading.Lock()
counter_file = Path(f"{sqlite_path(url)}.lazy-counter")
counter = {"value": int(counter_file.read_text()) if counter_file.exists() else 0}


def say(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def lazy_token():
    with lock:
        counter["value"] += 1
        if counter["value"] % 8 == 0:  # written whole or not at all: a kill -9 may land mid-write
            spare = counter_file.with_name(f"{counter_file.name}.{os.getpid()}")
            spare.write_text(str(counter["value"]))
            os.replace(spare, counter_file)
        return counter["value"]


def storm(rng):
    while True:
        scope = f"s{rng.randrange(4)}" if not mutant else "s0"
        say(f"invoke {scope}")
        lease = coord.acquire(scope, ttl_ms=200, wait_ms=5_000, keepalive=False)
        say(f"ok {scope} {lazy_token() if mutant else lease.token.value}")
        lease.release()


say("ready")
threads = [threading.Thread(target=storm, args=(random.Random(seed * 10 + i),), daemon=True) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
