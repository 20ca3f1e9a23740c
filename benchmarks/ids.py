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

Prints the median of ``--runs`` runs of each, per second of wall time and per
CPU second of this process, and each one's ratio to ``coordinated``.
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


def _rate(step: Callable[[], int], seconds: float) -> tuple[float, float]:
    """Ids per second, and per CPU second of this process, made by calling ``step`` for ``seconds``.

    ``step`` returns how many ids it made. The CPU figure is the one to read on
    a shared, busy machine: it leaves out the time other processes had the CPU.
    """
    made = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    end = started + seconds
    while True:
        for _ in range(64):
            made += step()
        now = time.perf_counter()
        if now >= end:
            cpu = max(1e-9, time.process_time() - cpu_started)
            return made / (now - started), made / cpu


def measure(seconds: float, runs: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        coord = stockade.connect(f"sqlite:///{Path(tmp) / 'coord.db'}?process=embedded")
        store = stockade.open_store(f"sqlite:///{Path(tmp) / 'store.db'}", cluster_id=coord.cluster_id)
        names = ["next_id", "next_block", "next_ids", "coordinated"]
        results: dict[str, list[float]] = {name: [] for name in names}
        results.update({f"{name} per cpu-s": [] for name in names})
        with IdGenerator(coord, "bench", store=store, max_clock_skew_ms=0) as ids:
            next_id, next_block, next_ids = ids.next_id, ids.next_block, ids.next_ids

            def one() -> int:
                next_id()
                return 1

            def coordinated() -> int:
                coord.acquire("bench-token", ttl_ms=10_000, keepalive=False).release()
                return 1

            steps = {"next_id": one, "next_block": lambda: len(next_block(4096)),
                     "next_ids": lambda: len(next_ids(100_000)), "coordinated": coordinated}
            for _ in range(runs):
                for name, step in steps.items():
                    wall, cpu = _rate(step, seconds)
                    results[name].append(wall)
                    results[f"{name} per cpu-s"].append(cpu)
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
    def ratio(name: str) -> float:
        return medians[name] / medians["coordinated per cpu-s" if name.endswith("cpu-s") else "coordinated"]

    if args.json:
        print(json.dumps({"runs": results, "median": medians,
                          "ratio_to_coordinated": {name: ratio(name) for name in medians}}, indent=2))
        return 0
    print(f"{'workload':<24} {'ids/s (median of ' + str(args.runs) + ')':>24} {'runs':>36} {'x coordinated':>14}")
    for name, value in medians.items():
        runs = " ".join(f"{v:,.0f}" for v in results[name])
        print(f"{name:<24} {value:>24,.0f} {runs:>36} {ratio(name):>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
