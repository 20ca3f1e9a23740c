#!/usr/bin/env python3
"""Many leases held by one sync client through `stockade serve`: its threads, memory, CPU per renewal, losses.

    python benchmarks/client_leases.py --leases 2000 --ttl-ms 6000 --hold-s 8 --runs 2 \\
        --a /path/to/before/src --b src

For each run and each checkout in turn (``--a``, then ``--b`` if given), a child
process with that checkout's source starts a `stockade serve`, acquires
``--leases`` leases (keepalive on), waits past their first renewal, and then for
``--hold-s`` seconds counts renewals (the ``on_renew`` hook) and its own CPU
(user and system, every thread). It prints one line a run: the most threads it
ran (read every 50 ms, its sampling thread not counted), its resident memory,
the renewals, the client's CPU per renewal, the leases lost at the end, the
time the releases took, and the load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r'''
import json, os, sys, threading, time
sys.path.insert(0, os.environ["BENCHMARKS"])
from serve_ab import start
import stockade
from stockade.client import Hooks

leases_n, ttl_ms, hold_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
proc, url = start(os.environ["PYTHONPATH"], sys.executable, [])
renewals = [0]
try:
    coord = stockade.connect(url, hooks=Hooks(on_renew=lambda lease: renewals.__setitem__(0, renewals[0] + 1)))
    leases = [coord.acquire(f"held-{i}", ttl_ms=ttl_ms) for i in range(leases_n)]
    peak, done = [threading.active_count()], threading.Event()

    def sample():
        while not done.wait(0.05):
            peak[0] = max(peak[0], threading.active_count())

    threading.Thread(target=sample, daemon=True).start()
    time.sleep(ttl_ms / 3000 + 0.5)  # past the first renewals
    cpu0, renewed0 = time.process_time(), renewals[0]
    time.sleep(hold_s)
    cpu1, renewed1 = time.process_time(), renewals[0]
    rss = int([line for line in open("/proc/self/status") if line.startswith("VmRSS")][0].split()[1]) // 1024
    lost = sum(lease.lost for lease in leases)
    done.set()
    released0 = time.perf_counter()
    for lease in leases:
        lease.release()
    released_s = time.perf_counter() - released0
    coord.close()
    print(json.dumps({
        "threads_max": peak[0] - 1, "rss_mib": rss, "renewals": renewed1 - renewed0,
        "cpu_us_per_renewal": round((cpu1 - cpu0) / max(1, renewed1 - renewed0) * 1e6), "lost": lost,
        "release_s": round(released_s, 2), "load": round(os.getloadavg()[0], 1),
    }))
finally:
    proc.terminate()
    proc.wait(30)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leases", type=int, default=2000)
    parser.add_argument("--ttl-ms", type=int, default=6000)
    parser.add_argument("--hold-s", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--a", default="src", help="the src/ of the first checkout")
    parser.add_argument("--b", default=None, help="the src/ of the second checkout (optional)")
    args = parser.parse_args()
    benchmarks = os.path.dirname(os.path.abspath(__file__))
    for run in range(args.runs):
        for tag, src in (("a", args.a), ("b", args.b)):
            if src is None:
                continue
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src), BENCHMARKS=benchmarks)
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.leases), str(args.ttl_ms), str(args.hold_s)],
                env=env, capture_output=True, text=True, timeout=1800,
            )
            print(f"run {run + 1} {tag}:", out.stdout.strip() or out.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
