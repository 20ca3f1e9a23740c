#!/usr/bin/env python3
"""Acquire latency and server memory as held leases pile up to the scope bound, on `stockade serve`.

    PYTHONPATH=src python benchmarks/held_leases.py --held 99999 --probes 300 --runs 3

Starts one `stockade serve` on a temporary data directory and holds leases on
``held-<i>`` scopes (one hour TTL, never released, sent by ``--senders``
threads of a child process), up to ``--held``. At each checkpoint (none held,
then 1,000, 10,000, 30,000, 60,000 and ``--held``) it times ``--probes`` acquires of one probe scope
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
import subprocess
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


def cpu_ns(pid: int) -> int:
    """The run time of every thread of ``pid`` so far, in ns (``/proc/<pid>/task/*/schedstat``)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def hold(url: str, first: int, last: int, senders: int) -> None:
    """Leases on ``held-<first>`` .. ``held-<last - 1>``, acquired by ``senders`` threads of a child process that
    then exits (the server keeps them for their hour): 100,000 `Lease` objects in the probing process itself made
    its own acquires 1.30-1.33× slower at 99,999 held while the server's stayed flat (0.97×)."""
    if last > first:
        subprocess.run([sys.executable, __file__, "--hold", url, str(first), str(last), str(senders)], check=True)


def _hold_here(url: str, first: int, last: int, senders: int) -> None:
    def send(part: range) -> None:
        with stockade.connect(url) as coord:
            for i in part:
                coord.acquire(f"held-{i}", ttl_ms=3_600_000, keepalive=False)

    threads = [threading.Thread(target=send, args=(range(first + k, last, senders),)) for k in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def probe(coord: stockade.Coordinator, probes: int, server_pid: int) -> tuple[float, float, float]:
    """p50 and p99 of an acquire of the probe scope, in µs, and the server's CPU per cycle (acquire and release)."""
    times = []
    cpu_before_ns = cpu_ns(server_pid)
    for _ in range(probes):
        began = time.perf_counter_ns()
        lease = coord.acquire("probe", ttl_ms=60_000)
        times.append((time.perf_counter_ns() - began) / 1000)
        lease.release()
    cpu_us = (cpu_ns(server_pid) - cpu_before_ns) / probes / 1000
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, len(times) * 99 // 100)], cpu_us


def one_run(args: argparse.Namespace) -> list[tuple[int, float, float, float, float]]:
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
                p50, p99, cpu_us = probe(coord, args.probes, proc.pid)
                rows.append((held, p50, p99, rss_mib(proc.pid), cpu_us))
                print(f"  held {held:>7,}: acquire p50 {p50:7.0f} µs  p99 {p99:7.0f} µs  server RSS "
                      f"{rows[-1][3]:6.1f} MiB  server CPU {cpu_us:5.0f} µs a cycle", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return rows


def main() -> int:
    if sys.argv[1:2] == ["--hold"]:
        url, first, last, senders = sys.argv[2], *map(int, sys.argv[3:6])
        _hold_here(url, first, last, senders)
        return 0
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
    print("| leases held | acquire p50 µs | acquire p99 µs | server RSS MiB | server CPU µs a cycle |\n"
          "|---|---|---|---|---|")
    for i, (held, *_rest) in enumerate(runs[0]):
        p50, p99, rss, cpu_us = (statistics.median(run[i][k] for run in runs) for k in (1, 2, 3, 4))
        print(f"| {held:,} | {p50:.0f} | {p99:.0f} | {rss:.1f} | {cpu_us:.0f} |")
    first, last = (statistics.median(run[i][1] for run in runs) for i in (0, -1))
    cpu_first, cpu_last = (statistics.median(run[i][4] for run in runs) for i in (0, -1))
    print(f"\np50 with {runs[0][-1][0]:,} held / with none: {last / first:.2f}, server CPU a cycle "
          f"{cpu_last / cpu_first:.2f} (medians of {args.runs} runs; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
