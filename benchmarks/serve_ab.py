#!/usr/bin/env python3
"""Two `stockade serve` builds side by side: server CPU per lock cycle and cycles/s, in steady state.

    python benchmarks/serve_ab.py --a /path/to/checkout-a/src --b /path/to/checkout-b/src --runs 3
    python benchmarks/serve_ab.py --a src --b src --b-args="--http-parser python"  # one build, two parsers

Starts one server from each source tree (``PYTHONPATH``), each on its own data
directory (``--a-args``/``--b-args``: more ``stockade serve`` arguments for one side),
then, run after run with the order rotated, drives each with
``stockade.bench.run_workload(WORKLOAD, ...)`` (``--workload``: ``lock``, the default, or ``write``, a
fenced write through the server's store; one client code for both: ``--client``,
default ``--a``), 1 client and N client processes. The server's CPU (utime +
stime from ``/proc/PID/stat``, all its threads) and its committed operations
(``stockade_commit_ops_total`` at ``/metrics``; a cycle is two) and its commits
(``stockade_commit_batches_total``: one fsync each) are sampled in
the middle half of each run, so start-up and connection set-up are left out.
Prints each run and the medians, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def commit_counts(url: str, file: str = "coordinator") -> tuple[float, float]:
    """``(operations, batches)`` committed so far to ``file`` (a batch is one COMMIT, one fsync)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    counts = []
    for name in ("ops", "batches"):
        found = re.search(rf'stockade_commit_{name}_total\{{file="{file}"\}} ([0-9.e+]+)', text)
        counts.append(float(found.group(1)) if found else 0.0)
    return counts[0], counts[1]


def start(src: str, python: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    data = tempfile.mkdtemp(prefix="serve-ab-")
    proc = subprocess.Popen([python, "-m", "stockade", "serve", "--data-dir", data, "--port", "0", *extra],
                            env=dict(os.environ, PYTHONPATH=src), stdout=subprocess.PIPE,
                            stderr=open(f"{data}/server.log", "wb"))
    line = b""
    while b"listening on" not in line:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(open(f"{data}/server.log").read())
    return proc, line.decode().strip().rsplit(" ", 1)[-1]


def one_run(args: argparse.Namespace, proc: subprocess.Popen[bytes], url: str, clients: int, tag: str
            ) -> tuple[float, float, float, float]:
    code = (f"import json; from stockade.bench import run_workload; r = run_workload({args.workload!r}, {url!r}, "
            f"clients={clients}, seconds={args.seconds}, iters=10**9, tag={tag!r}); print(json.dumps(r.as_dict()))")
    bench = subprocess.Popen([args.python, "-c", code], env=dict(os.environ, PYTHONPATH=args.client or args.a),
                             stdout=subprocess.PIPE, text=True)
    try:  # a stop (Ctrl-C, SIGTERM) in the middle ends the clients too
        time.sleep(args.seconds * 0.25 + 1.5)
        file, ops_per_cycle = ("coordinator", 2) if args.workload == "lock" else ("store", 1)
        cpu0, (ops0, batches0), wall0 = cpu_s(proc.pid), commit_counts(url, file), time.monotonic()
        load = os.getloadavg()[0]
        time.sleep(args.seconds * 0.5)
        cpu1, (ops1, batches1), wall1 = cpu_s(proc.pid), commit_counts(url, file), time.monotonic()
        json.loads(bench.communicate()[0].strip().splitlines()[-1])  # the run itself succeeded
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    cycles = (ops1 - ops0) / ops_per_cycle  # a lock cycle commits two operations, a fenced write one
    per_cycle = (cpu1 - cpu0) / cycles * 1e6 if cycles else float("nan")
    return per_cycle, cycles / (wall1 - wall0), load, ((batches1 - batches0) / cycles if cycles else float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="source tree of side A (its src/)")
    parser.add_argument("--b", required=True, help="source tree of side B (its src/)")
    parser.add_argument("--a-args", default="", help="more stockade serve arguments for side A (one string)")
    parser.add_argument("--b-args", default="", help="more stockade serve arguments for side B (one string)")
    parser.add_argument("--client", help="source tree of the bench client (default: --a)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="per run; the middle half is sampled")
    parser.add_argument("--clients", type=int, default=8, help="client processes of the concurrent run")
    parser.add_argument("--workload", choices=("lock", "write"), default="lock",
                        help="lock: acquire -> release (a cycle); write: one fenced put (a cycle)")
    args = parser.parse_args()
    # SIGTERM as Ctrl-C: the servers and clients started here are stopped, their directories removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    sides = {"A": args.a, "B": args.b}
    extra = {"A": args.a_args.split(), "B": args.b_args.split()}
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    try:
        for side, src in sides.items():  # inside the try: a side that fails to start stops the one started
            servers[side] = start(src, args.python, extra[side])
        for run in range(args.runs):
            for clients in (1, args.clients):
                for side in (list(sides) if run % 2 == 0 else list(sides)[::-1]):
                    proc, url = servers[side]
                    row = one_run(args, proc, url, clients, f"r{run}c{clients}")
                    results.setdefault((side, clients), []).append(row)
                    print(f"run {run + 1} {side} {clients}c: {row[1]:7.0f} cycles/s, "
                          f"server CPU {row[0]:5.0f} us/cycle, {row[3]:.2f} commits/cycle, load {row[2]:.1f}",
                          flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(proc.args[proc.args.index("--data-dir") + 1], ignore_errors=True)
    print(f"medians of {args.runs} runs:")
    for (side, clients), rows in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  {side} {clients}c: {statistics.median(r[1] for r in rows):7.0f} cycles/s, "
              f"{statistics.median(r[0] for r in rows):5.0f} us server CPU/cycle, "
              f"{statistics.median(r[3] for r in rows):.2f} commits/cycle, "
              f"load {statistics.median(r[2] for r in rows):.1f}")
    for clients in (1, args.clients):
        a_rows, b_rows = results[("A", clients)], results[("B", clients)]
        rate = statistics.median(r[1] for r in b_rows) / statistics.median(r[1] for r in a_rows)
        cpu = statistics.median(r[0] for r in b_rows) / statistics.median(r[0] for r in a_rows)
        print(f"  B/A {clients}c: cycles/s {rate:.2f}, server CPU/cycle {cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
