"""Ids per second in one process: stockade.ids beside one coordinated id per call.

    PYTHONPATH=src python benchmarks/ids.py [--seconds 2] [--runs 3] [--json]

Measures, in one process against an embedded sqlite coordinator in a
temporary directory, interleaved run by run:

- ``next_id``: `IdGenerator.next_id()` in a tight loop, one id per call;
- ``next_block``: `IdGenerator.next_block(4096)`, a range of ids per call;
- ``next_ids``: `IdGenerator.next_ids(100_000)`, a list per call;
- ``coordinated``: one id per call from the coordinator itself: the fencing
  token of ``coord.acquire(scope, keepalive=False)`` (then released), the
  cheapest strictly increasing number the coordinator hands out.

Prints the median of ``--runs`` runs of each, and each one's ratio to
``coordinated``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import stockade
from stockade.ids import IdGenerator


def _rate(step: Callable[[], int], seconds: float) -> float:
    """Ids per second made by calling ``step`` (which returns how many it made) for ``seconds``."""
    made = 0
    started = time.perf_counter()
    end = started + seconds
    while True:
        for _ in range(64):
            made += step()
        now = time.perf_counter()
        if now >= end:
            return made / (now - started)


def measure(seconds: float, runs: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        coord = stockade.connect(f"sqlite://{Path(tmp) / 'coord.db'}")
        store = stockade.open_store(f"sqlite://{Path(tmp) / 'store.db'}", cluster_id=coord.cluster_id)
        results: dict[str, list[float]] = {"next_id": [], "next_block": [], "next_ids": [], "coordinated": []}
        with IdGenerator(coord, "bench", store=store, max_clock_skew_ms=0) as ids:
            next_id, next_block, next_ids = ids.next_id, ids.next_block, ids.next_ids

            def one() -> int:
                next_id()
                return 1

            def coordinated() -> int:
                coord.acquire("bench-token", ttl_ms=10_000, keepalive=False).release()
                return 1

            for _ in range(runs):
                results["next_id"].append(_rate(one, seconds))
                results["next_block"].append(_rate(lambda: len(next_block(4096)), seconds))
                results["next_ids"].append(_rate(lambda: len(next_ids(100_000)), seconds))
                results["coordinated"].append(_rate(coordinated, seconds))
        store.close()
        coord.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one measurement")
    parser.add_argument("--runs", type=int, default=3, help="runs of each; the median is reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = measure(args.seconds, args.runs)
    medians = {name: statistics.median(values) for name, values in results.items()}
    base = medians["coordinated"]
    if args.json:
        print(json.dumps({"runs": results, "median": medians, "ratio_to_coordinated":
                          {name: value / base for name, value in medians.items()}}, indent=2))
        return 0
    print(f"{'workload':<12} {'ids/s (median of ' + str(args.runs) + ')':>24} {'runs':>36} {'x coordinated':>14}")
    for name, value in medians.items():
        runs = " ".join(f"{v:,.0f}" for v in results[name])
        print(f"{name:<12} {value:>24,.0f} {runs:>36} {value / base:>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
