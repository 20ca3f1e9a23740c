"""One id-making process of the Snowflake fault run (tests/test_ids.py).

``python ids_worker.py CONFIG_JSON``: leases a worker number, makes ids in
blocks and appends each generator session's ids (ascending, signed 64-bit,
native order) to its own file ``<out>/<label>.<pid>.<session>.bin``, opening a
new generator whenever the old one stops (lease lost, clock behind). It runs
until SIGTERM. The run kills it (-9), freezes it (SIGSTOP) and steps its wall
clock through libfaketime's timestamp file. Counters go to stderr as one JSON
line per event, for the run's figures.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from array import array

# Under libfaketime with the monotonic clock left alone, clock_nanosleep on the
# monotonic clock fails with EINVAL: sleep on a condition variable instead.
time.sleep = lambda seconds: threading.Event().wait(seconds)  # type: ignore[assignment]

import stockade  # noqa: E402
from stockade.core.errors import LeaseLost, LimitExceeded, StockadeError  # noqa: E402
from stockade.recipes.ids import ClockBehind, IdGenerator, Layout  # noqa: E402


def event(kind: str, **fields: object) -> None:
    sys.stderr.write(json.dumps({"event": kind, **fields}) + "\n")
    sys.stderr.flush()


def main() -> None:
    config = json.loads(sys.argv[1])
    control = config.get("control", "")
    if control == "ignore_lease":
        IdGenerator._check_lease = False
    elif control == "no_handoff":
        IdGenerator._handoff_floor = False
    coord = stockade.connect(config["coord"])
    store = None
    if config.get("store"):
        store = stockade.open_store(config["store"], cluster_id=coord.cluster_id)
    layout = Layout(**config["layout"])
    block = config.get("block", 512)
    pace_s = block / config["pace_ids_s"] if config.get("pace_ids_s") else 0.0
    waiter = threading.Event()
    session = 0
    while True:
        try:
            gen = IdGenerator(
                coord, config["name"], layout=layout, store=store, ttl_ms=config["ttl_ms"],
                max_clock_skew_ms=config["skew_ms"], reserve_ms=config["reserve_ms"],
                max_behind_ms=config["max_behind_ms"], max_handoff_wait_ms=config["max_handoff_wait_ms"],
            )
        except StockadeError as exc:  # no free number yet, a clock behind the floor, a lost claim
            waiter.wait(0.02)
            if not isinstance(exc, LimitExceeded):
                event("open_failed", error=type(exc).__name__)
            continue
        session += 1
        event("opened", worker=gen.worker, floor=gen.floor)
        path = os.path.join(config["out"], f"{config['label']}.{os.getpid()}.{session}.bin")
        with open(path, "wb", buffering=0) as out:
            try:
                while True:
                    ids = gen.next_block(block)
                    out.write(array("q", ids).tobytes())
                    if pace_s:
                        waiter.wait(pace_s)
            except ClockBehind as exc:
                event("clock_behind", behind_ms=exc.behind_ms)
            except LeaseLost as exc:
                event("lease_lost", cause=exc.cause)
            except StockadeError as exc:
                event("error", error=repr(exc))
            finally:
                gen.close()


if __name__ == "__main__":
    main()
