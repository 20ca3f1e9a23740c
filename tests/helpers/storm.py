"""An acquire storm against one coordinator file; killed with -9 by the S11 test.

Prints ``invoke SCOPE`` before each acquire and ``ok SCOPE TOKEN`` after the
reply, flushed, so that the test knows which grants were acknowledged and
which were in flight when the process died.
"""

import random
import sys
import threading

import stockade

url, seed = sys.argv[1], int(sys.argv[2])
coord = stockade.connect(url)
lock = threading.Lock()


def say(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def storm(rng):
    while True:
        scope = f"s{rng.randrange(4)}"
        say(f"invoke {scope}")
        lease = coord.acquire(scope, ttl_ms=200, wait_ms=5_000, keepalive=False)
        say(f"ok {scope} {lease.token.value}")
        lease.release()


threads = [threading.Thread(target=storm, args=(random.Random(seed * 10 + i),), daemon=True) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
