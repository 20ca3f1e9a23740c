#!/usr/bin/env python3
"""The coordinator file embedded in each process (``?process=embedded``) against its host process (the default).

    PYTHONPATH=src python benchmarks/host_ab.py --runs 3 --seconds 6 --clients 8

Variants, each on a coordinator file of its own: ``embedded`` (``sqlite:///F?process=embedded``),
``host`` (``sqlite:///F``, the default: the host process parsing with httptools
when it is installed) and ``host-python`` (the same, its host process started
with ``STOCKADE_HTTP_PARSER=python``: the base install's parser). Run after run,
the order rotated, each is driven by ``stockade.bench.run_workload("lock", ...)``
in a process of its own, 1 client and N client processes. Prints each run's
cycles/s and CPU per cycle (the bench process with its client processes
around the workload, ``getrusage``, plus the host process's from ``/proc``), then the medians and the
ratios to ``embedded``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from stockade.coordinators.sqlite._host import socket_path, start_host_process

TICK = os.sysconf("SC_CLK_TCK")
VARIANTS = {"embedded": "?process=embedded", "host": "", "host-python": ""}  # host: the default url


def cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def host_pid(file: Path) -> int | None:
    """The process listening on ``file``'s socket (its peer credentials), None if none answers."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(str(socket_path(file)))
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    except OSError:
        return None
    finally:
        sock.close()


def env_of(variant: str) -> dict[str, str]:
    env = dict(os.environ)
    if variant == "host-python":
        env["STOCKADE_HTTP_PARSER"] = "python"
    else:
        env.pop("STOCKADE_HTTP_PARSER", None)
    return env


def one_run(args: argparse.Namespace, variant: str, file: Path, clients: int, tag: str
            ) -> tuple[float, float, float, float]:
    """cycles/s, CPU µs per cycle (clients and host process), load average, the host process's CPU µs per cycle."""
    url = f"sqlite:///{file}{VARIANTS[variant]}"
    pid = None
    if variant != "embedded":
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env_of(variant))
        try:
            start_host_process(file)  # up before the run: its start-up is not counted
        finally:
            os.environ.clear()
            os.environ.update(saved)
        pid = host_pid(file)
    # the clients' CPU: the bench process's and its client processes', around the workload (not its imports)
    code = (f"import json, resource; from stockade.bench import run_workload\n"
            f"def cpu():\n"
            f"    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF), "
            f"resource.getrusage(resource.RUSAGE_CHILDREN)))\n"
            f"c0 = cpu(); r = run_workload('lock', {url!r}, clients={clients}, seconds={args.seconds}, iters=10**9, "
            f"tag={tag!r}); print(json.dumps(dict(r.as_dict(), cpu_s=cpu() - c0)))")
    load = os.getloadavg()[0]
    host0 = cpu_s(pid)
    out = subprocess.run([sys.executable, "-c", code], env=env_of(variant), stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    host1 = cpu_s(pid)
    result = json.loads(out.strip().splitlines()[-1])
    cycles = max(1, result["n"])
    cpu = result["cpu_s"] + (host1 - host0)
    return result["ops_s"], cpu / cycles * 1e6, load, (host1 - host0) / cycles * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="per run")
    parser.add_argument("--clients", type=int, default=8, help="client processes of the concurrent run")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    variants = args.variants.split(",")
    base = Path(tempfile.mkdtemp(prefix="host-ab-"))
    files = {v: base / v / "coord.db" for v in variants}
    for file in files.values():
        file.parent.mkdir()
    results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    for run in range(args.runs):
        for clients in (1, args.clients):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for variant in order:
                row = one_run(args, variant, files[variant], clients, f"r{run}c{clients}")
                results.setdefault((variant, clients), []).append(row)
                print(f"run {run + 1} {variant:12} {clients}c: {row[0]:7.0f} cycles/s, CPU {row[1]:6.0f} us/cycle "
                      f"(host process {row[3]:5.0f}), load {row[2]:.1f}", flush=True)
    print(f"medians of {args.runs} runs:")
    for clients in (1, args.clients):
        first = None
        for variant in variants:
            rows = results[(variant, clients)]
            rate, cpu = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
            first = first or (rate, cpu)
            print(f"  {variant:12} {clients}c: {rate:7.0f} cycles/s ({rate / first[0]:.2f}x), "
                  f"{cpu:6.0f} us CPU/cycle ({cpu / first[1]:.2f}x; host process "
                  f"{statistics.median(r[3] for r in rows):5.0f}), load {statistics.median(r[2] for r in rows):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
