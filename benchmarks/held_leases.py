#!/usr/bin/env python3
"""Acquire latency and server memory as held leases pile up to the scope bound, on `stockade serve`.

    PYTHONPATH=src python benchmarks/held_leases.py --held 99999 --probes 300 --runs 3

Starts one `stockade serve` on a temporary data directory and holds leases on
``held-<i>`` scopes (one hour TTL, never released, sent by ``--senders``
threads), up to ``--held``. At each checkpoint (none held, then 1,000, 10,000,
30,000, 60,000 and ``--held``) it times ``--probes`` acquires of one probe scope
(each released before the next; the release is not timed) and reads the
server's resident memory (``VmRSS``). The server keeps up to 100,000 scopes
(`STORE_SCOPES_MAX`): 99,999 held and the probe fill it. Prints p50 and p99 of
the acquire per checkpoint, medians over ``--runs`` runs (a new server each),
the ratio of the last checkpoint's p50 to the first's, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from serve_ab import start  # beside this file

import stockade

CHECKPOINTS = (0, 1_000, 10_000, 30_000, 60_000)


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def hold(url: str, first: int, last: int, senders: int) -> list[object]:
    """Leases on ``held-<first>`` .. ``held-<last - 1>``, acquired by ``senders`` threads, kept."""
    kept: list[object] = []
    lock = threading.Lock()

    def send(part: range) -> None:
        with stockade.connect(url) as coord:
            mine = [coord.acquire(f"held-{i}", ttl_ms=3_600_000) for i in part]
        with lock:
            kept.extend(mine)

    threads = [threading.Thread(target=send, args=(range(first + k, last, senders),)) for k in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return kept


def probe(coord: stockade.Coordinator, probes: int) -> tuple[float, float]:
    """p50 and p99 of an acquire of the probe scope, in µs."""
    times = []
    for _ in range(probes):
        began = time.perf_counter_ns()
        lease = coord.acquire("probe", ttl_ms=60_000)
        times.append((time.perf_counter_ns() - began) / 1000)
        lease.release()
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, len(times) * 99 // 100)]


def one_run(args: argparse.Namespace) -> list[tuple[int, float, float, float]]:
    proc, url = start(os.environ.get("PYTHONPATH", "src"), sys.executable, [])
    rows = []
    try:
        held = 0
        with stockade.connect(url) as coord:
            for checkpoint in (*CHECKPOINTS, args.held):
                if checkpoint < held or checkpoint > args.held:
                    continue
                hold(url, held, checkpoint, args.senders)  # held for an hour: the server keeps them
                held = checkpoint
                p50, p99 = probe(coord, args.probes)
                rows.append((held, p50, p99, rss_mib(proc.pid)))
                print(f"  held {held:>7,}: acquire p50 {p50:7.0f} µs  p99 {p99:7.0f} µs  server RSS "
                      f"{rows[-1][3]:6.1f} MiB", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=99_999)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for run in range(args.runs):
        print(f"run {run + 1} of {args.runs} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        runs.append(one_run(args))
    print("| leases held | acquire p50 µs | acquire p99 µs | server RSS MiB |\n|---|---|---|---|")
    for i, (held, *_rest) in enumerate(runs[0]):
        p50, p99, rss = (statistics.median(run[i][k] for run in runs) for k in (1, 2, 3))
        print(f"| {held:,} | {p50:.0f} | {p99:.0f} | {rss:.1f} |")
    first, last = (statistics.median(run[i][1] for run in runs) for i in (0, -1))
    print(f"\np50 with {runs[0][-1][0]:,} held / with none: {last / first:.2f} (medians of {args.runs} runs; "
          f"load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
