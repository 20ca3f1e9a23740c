#!/usr/bin/env python3
"""The PostgreSQL coordinator's lock cycle counted in instructions, not timed: a server under callgrind.

A lock cycle of the coordinator's common path is two calls of its server
functions (the grant, then the release: ``stockade_coord_grant_10`` and
``stockade_coord_keep_10``), each its own autocommit transaction, as
`stockade.coordinators.postgres` sends them (prepared statements). Their time on
a shared machine moves with the other jobs' load; the instructions the backend
executes do not. This starts PostgreSQL 15 under ``valgrind --tool=callgrind``
(every backend writes its count when it exits), installs the coordinator's
tables and functions with ``stockade.connect``, and runs one session of ``--lo``
and one of ``--hi`` lock cycles on one used scope: the difference of the two
sessions' counts, divided by ``hi - lo``, is the work of a cycle (the session's
set-up and its first plans cancel out). The tables are analyzed after a warm-up
(the server runs without autovacuum, whose analyses would come at any time): the
plans are those of a database in use. ``--before SRC`` (another checkout's ``src``)
installs that revision's functions in a second database of the same server and
counts them the same way. Slow (valgrind runs the server about 50 times slower):
a minute or two. Needs valgrind.

    PYTHONPATH=src python benchmarks/pg_cycle_ir.py
    mkdir /tmp/before && git archive main src | tar -x -C /tmp/before
    PYTHONPATH=src python benchmarks/pg_cycle_ir.py --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from fence_postgres_ir import per_step, start, stop

#: The two statements of a cycle, as the coordinator prepares them (its `_GRANT` and `_KEEP`).
GRANT = "SELECT token, now_ns FROM stockade_coord_grant_10(%s, %s, %s, %s, %s)"
RELEASE = "SELECT scope, holder, token, ttl_ms, granted_ns, expires_ns, now_ns FROM stockade_coord_keep_10(%s, %s)"
SCOPE = "orders"
TTL_MS = 60_000
LEASES_MAX = 1_000_000
WARM_UP_CYCLES = 50


def install(dsn: str, src: str) -> None:
    """The coordinator's tables and functions of checkout ``src``, installed by its own ``stockade.connect``."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    url = f"postgresql://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
    subprocess.run([sys.executable, "-c", f"import stockade; stockade.connect({url!r}).close()"], check=True,
                   env={**os.environ, "PYTHONPATH": src})


def cycle(conn: psycopg.Connection, holder: str) -> None:
    lease_id = uuid.uuid4().hex
    if conn.execute(GRANT, (SCOPE, lease_id, holder, TTL_MS, LEASES_MAX), prepare=True).fetchone() is None:
        raise RuntimeError("not granted on the common path")
    if conn.execute(RELEASE, (lease_id, True), prepare=True).fetchone() is None:
        raise RuntimeError("not released on the common path")


def per_cycle(root: Path, dsn: str, lo: int, hi: int) -> float:
    return per_step(root, dsn, lambda conn: cycle(conn, "bench"), lo, hi)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lo", type=int, default=20, help="lock cycles of the shorter session")
    parser.add_argument("--hi", type=int, default=80, help="lock cycles of the longer session")
    parser.add_argument("--before", help="another checkout's src: its functions too, in a second database")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-pg-cycle-ir-"))
    root.chmod(0o777)
    server, dsn = start(root)
    try:
        dsns = {"this checkout": dsn}
        if args.before:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE DATABASE stockade_before")
            dsns["--before"] = dsn.replace("dbname=postgres", "dbname=stockade_before")
        install(dsn, str(Path(__file__).resolve().parent.parent / "src"))
        if args.before:
            install(dsns["--before"], args.before)
        print("| functions | instructions per lock cycle |\n|---|---|")
        for name, target in dsns.items():
            with psycopg.connect(target, autocommit=True) as conn:
                for _ in range(WARM_UP_CYCLES):  # a used scope: its row exists, as in the common case
                    cycle(conn, "warm-up")
                conn.execute("ANALYZE")  # the plans of a database whose tables autovacuum has analyzed
            total = per_cycle(root, target, args.lo, args.hi)
            print(f"| {name} | {total:,.0f} |")
    finally:
        stop(server, root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
