#!/usr/bin/env python3
"""The client's CPU per lock cycle: stockade's remote client beside psycopg, in one run.

    PYTHONPATH=src python benchmarks/client_cpu.py --runs 3 --seconds 4 --clients 8 [--before CHECKOUT/src]

Only the client processes are measured, never the servers: each client process
reads its own CPU (user and system, ``getrusage(RUSAGE_SELF)``: all its threads) around
its measured cycles, after a warm-up of 20 cycles, and the figure is the sum
over the client processes divided by the cycles they made. The two sides:

- ``stockade``: ``stockade.connect("http://...")``, then ``acquire(scope,
  ttl_ms=10_000, keepalive=False)`` and ``release()`` of the lease, against a
  ``stockade serve`` started on a free loopback port in a temporary directory
  (durable, its defaults);
- ``psycopg``: psycopg 3 on one autocommit connection, the two statements of a
  lease row (the peers' ``pg-lease-row``): an upsert that takes the scope's row
  when it is free or expired and returns the token from a sequence, then the
  release's delete of that row with that token; prepared statements, against a
  PostgreSQL 15 started on a free loopback port (fsync on, its defaults).

Each client process has its own scope. Run after run, the order rotated,
each side with 1 client and N client processes started together at a barrier;
prints every run, then the medians of the client CPU per cycle, the ratio
stockade / psycopg, cycles/s and the load average. ``--before CHECKOUT/src``
adds a third side, ``stockade-before``: the same cycles by the client of another
checkout, run in a child interpreter importing that ``src`` (against the same
server), so that two versions are compared in the same runs. ``--profile FILE`` instead
runs the stockade side in this process under ``cProfile`` (1 client) and writes
its statistics to FILE. Needs ``psycopg`` importable (it is not a stockade
dependency) and PostgreSQL 15 (``scripts/install.sh``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WARM_UP_CYCLES = 20
TTL_MS = 10_000
SIDES = ("stockade", "psycopg")


def _stockade_cycles(url: str, scope: str, seconds: float, barrier) -> tuple[int, float, float, float]:
    import stockade

    coord = stockade.connect(url)
    try:
        def cycle() -> None:
            lease = coord.acquire(scope, ttl_ms=TTL_MS, keepalive=False)
            lease.release()

        return _measure(cycle, seconds, barrier)
    finally:
        coord.close()


def _psycopg_cycles(dsn: str, scope: str, seconds: float, barrier) -> tuple[int, float, float, float]:
    import psycopg
    from pg_layouts import _LEASE_GRANT, _LEASE_RELEASE  # the peers' lease row

    with psycopg.connect(dsn, autocommit=True) as conn:
        holder = uuid.uuid4().hex

        def cycle() -> None:
            params = {"scope": scope, "holder": holder}
            row = conn.execute(_LEASE_GRANT, params, prepare=True).fetchone()
            if row is None:
                raise RuntimeError(f"not granted: {scope}")
            params["token"] = row[0]
            if conn.execute(_LEASE_RELEASE, params, prepare=True).fetchone() is None:
                raise RuntimeError(f"not released: {scope}")

        return _measure(cycle, seconds, barrier)


def _measure(cycle, seconds: float, barrier) -> tuple[int, float, float, float]:
    """Cycles, wall seconds and this process's user and system CPU seconds over the measured part (after the
    warm-up)."""
    for _ in range(WARM_UP_CYCLES):
        cycle()
    barrier.wait()
    cycles, start, cpu0 = 0, time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    while time.perf_counter() - start < seconds:
        cycle()
        cycles += 1
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return cycles, time.perf_counter() - start, cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime


def _client(side: str, target: str, scope: str, seconds: float, barrier, results) -> None:
    try:
        run = _stockade_cycles if side == "stockade" else _psycopg_cycles
        results.put(run(target, scope, seconds, barrier))
    except BaseException as exc:  # the parent reports it (instead of waiting for this process's figures)
        barrier.abort()
        results.put(f"{type(exc).__name__}: {exc}")
        raise


def measure(side: str, target: str, clients: int, seconds: float, run: int, before: Path | None = None) -> dict:
    """One run of ``side`` with ``clients`` processes: client CPU µs per cycle and cycles/s.

    ``stockade-before`` runs in a child interpreter importing stockade from ``before`` (another checkout's src).
    """
    if side == "stockade-before":
        env = dict(os.environ, PYTHONPATH=str(before))
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(["stockade", target, clients, seconds,
                                                                                 run])],
                             env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        return dict(json.loads(out.strip().splitlines()[-1]), side=side)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(side, target, f"cpu-{side}-{run}-{clients}-{i}", seconds, barrier,
                                               results)) for i in range(clients)]
    load = os.getloadavg()[0]
    for p in procs:
        p.start()
    got = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    failed = [g for g in got if isinstance(g, str)]
    if failed:
        raise RuntimeError(f"{side}, {clients} clients: {failed[0]}")
    cycles = sum(g[0] for g in got)
    return {"side": side, "clients": clients, "run": run, "cycles": cycles, "load": load,
            "per_s": cycles / max(g[1] for g in got), "cpu_us": sum(g[2] + g[3] for g in got) / cycles * 1e6,
            "sys_us": sum(g[3] for g in got) / cycles * 1e6}


def report(rows: list[dict], clients: list[int], sides: list[str]) -> str:
    out = ["| clients | side | runs | client CPU µs/cycle | of which system | / psycopg | cycles/s | load |",
           "|---|---|---|---|---|---|---|---|"]
    for n in clients:
        med = {side: {key: statistics.median(r[key] for r in rows if r["side"] == side and r["clients"] == n)
                      for key in ("cpu_us", "sys_us", "per_s", "load")} for side in sides}
        runs = sum(1 for r in rows if r["side"] == sides[0] and r["clients"] == n)
        loads = [r["load"] for r in rows if r["clients"] == n]
        for side in sides:
            m = med[side]
            out.append(f"| {n} | {side} | {runs} | {m['cpu_us']:.0f} | {m['sys_us']:.0f} | "
                       f"{m['cpu_us'] / med['psycopg']['cpu_us']:.2f}x | {m['per_s']:.0f} | "
                       f"{min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(out)


def profile(url: str, seconds: float, out: Path) -> None:
    """The stockade side's 1 client in this process, under cProfile."""
    import cProfile

    import stockade

    coord = stockade.connect(url)
    scope = f"cpu-profile-{uuid.uuid4().hex[:6]}"
    for _ in range(WARM_UP_CYCLES):
        coord.acquire(scope, ttl_ms=TTL_MS, keepalive=False).release()
    profiler = cProfile.Profile()
    deadline, cycles = time.perf_counter() + seconds, 0
    profiler.enable()
    while time.perf_counter() < deadline:
        coord.acquire(scope, ttl_ms=TTL_MS, keepalive=False).release()
        cycles += 1
    profiler.disable()
    coord.close()
    profiler.dump_stats(str(out))
    print(f"{cycles} cycles profiled; statistics in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=8, help="client processes of the second phase (first: 1)")
    parser.add_argument("--profile", type=Path, help="profile the stockade side (1 client) into this file instead")
    parser.add_argument("--before", type=Path, help="another checkout's src: its client as a third side")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run of a side, in this interpreter, as JSON
    args = parser.parse_args()
    if args.child:
        side, target, clients, seconds, run = json.loads(args.child)
        print(json.dumps(measure(side, target, clients, seconds, run)))
        return 0
    if not 1 <= args.runs <= 50 or not 0.5 <= args.seconds <= 60 or not 2 <= args.clients <= 64:
        parser.error("--runs 1..50, --seconds 0.5..60, --clients 2..64")
    root = Path(tempfile.mkdtemp(prefix="stockade-client-cpu-"))
    from side_by_side import Servers  # the servers it starts, and how

    servers = Servers(root)
    try:
        url = servers.start_stockade([])
        if args.profile:
            profile(url, args.seconds, args.profile)
            return 0
        port = servers.start_postgres()
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        import psycopg
        from pg_layouts import SETUP

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SETUP)
        targets, rows = {"stockade": url, "psycopg": dsn, "stockade-before": url}, []
        sides = list(SIDES) + (["stockade-before"] if args.before else [])
        for run in range(args.runs):
            for clients in (1, args.clients):
                for side in sides[run % len(sides):] + sides[:run % len(sides)]:
                    rows.append(measure(side, targets[side], clients, args.seconds, run, args.before))
                    r = rows[-1]
                    print(f"run {run + 1} {side:15s} {clients}c: client CPU {r['cpu_us']:5.0f} µs/cycle "
                          f"({r['sys_us']:3.0f} system), "
                          f"{r['per_s']:6.0f} cycles/s, load {r['load']:.1f}", flush=True)
        print(report(rows, [1, args.clients], sides))
    finally:
        servers.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
