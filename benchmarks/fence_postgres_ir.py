#!/usr/bin/env python3
"""The PostgreSQL fence's check counted in instructions, not timed: a server under callgrind.

The time of a fenced transaction on a shared machine moves with the other jobs'
load; the instructions its backend executes do not. This starts PostgreSQL 15
under ``valgrind --tool=callgrind`` (every backend writes its count when it
exits), installs the fence, and for each variant runs one session of ``--lo``
and one of ``--hi`` transactions ``BEGIN; <query>; ROLLBACK``, with a token equal
to the scope's mark: the difference of the two sessions' counts, divided by
``hi - lo``, is the variant's work per transaction (the session's set-up and its
first plans cancel out). Prints ``BEGIN; SELECT 1`` and the installed check;
``--before SRC`` (another checkout's ``src``) adds that revision's check, as
``stockade.fence_before`` (fence_postgres.py's ``install_before``). Slow (valgrind
runs the server about 50 times slower): a minute or two. Needs valgrind.

    PYTHONPATH=src python benchmarks/fence_postgres_ir.py
    mkdir /tmp/before && git archive main src | tar -x -C /tmp/before
    PYTHONPATH=src python benchmarks/fence_postgres_ir.py --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from fence_postgres import CLUSTER, PG_BIN, as_postgres, install_before, start_postgres

from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import postgres as pg


def start(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """PostgreSQL under callgrind, each process writing ``root/cg.<pid>`` when it exits."""
    return start_postgres(root, wrapper=("valgrind", "--tool=callgrind", f"--callgrind-out-file={root}/cg.%p"),
                          settings=("autovacuum=off",), start_s=300, poll_s=0.5)


def instructions(root: Path, pid: int) -> int:
    """The total a backend's callgrind file reports, once the backend has exited and written it."""
    path = root / f"cg.{pid}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(("totals:", "summary:")):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"no count from backend {pid}")


def per_step(root: Path, dsn: str, step: Callable[[psycopg.Connection], object], lo: int, hi: int) -> float:
    """The instructions of one ``step``: a session of ``lo`` steps and one of ``hi``, each on a backend of its own;
    the difference of their counts over ``hi - lo`` (the sessions' set-up and first plans cancel out)."""
    counts = []
    for count in (lo, hi):
        conn = psycopg.connect(dsn, autocommit=True)
        pid = conn.info.backend_pid
        for _ in range(count):
            step(conn)
        conn.close()
        counts.append(instructions(root, pid))
    return (counts[1] - counts[0]) / (hi - lo)


def per_transaction(root: Path, dsn: str, query: str, lo: int, hi: int) -> float:
    return per_step(root, dsn, lambda conn: conn.execute(f"BEGIN; {query}; ROLLBACK", prepare=False), lo, hi)


def stop(server: subprocess.Popen[bytes], root: Path) -> None:
    """Stop the server under valgrind (slow to exit) and remove its directory."""
    subprocess.run([*as_postgres(), str(PG_BIN / "pg_ctl"), "stop", "-D", str(root / "data"), "-m", "fast"],
                   capture_output=True, cwd="/")
    server.wait(120)
    shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lo", type=int, default=30, help="transactions of the shorter session")
    parser.add_argument("--hi", type=int, default=130, help="transactions of the longer session")
    parser.add_argument("--before", help="another checkout's src: adds its check")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-pg-ir-"))
    root.chmod(0o777)
    server, dsn = start(root)
    try:
        keys = FixedKeys(ephemeral_keyring(CLUSTER))
        token = keys.sign(FencingToken(CLUSTER, "orders", 7)).encode()
        with psycopg.connect(dsn, autocommit=True) as conn:
            pg.install(conn, keys=keys)
            with pg.fenced(conn, token):  # the mark: the checks below take the common path, an equal token
                pass
            if args.before:
                install_before(conn, args.before)
        base = per_transaction(root, dsn, "SELECT 1", args.lo, args.hi)
        print(f"| query | instructions per transaction | over SELECT 1 |\n|---|---|---|\n| SELECT 1 | {base:,.0f} | |")
        for name in ("fence", "fence_before") if args.before else ("fence",):
            count = per_transaction(root, dsn, f"SELECT stockade.{name}('{token}', 'orders')", args.lo, args.hi)
            print(f"| stockade.{name} | {count:,.0f} | {count - base:,.0f} |")
    finally:
        stop(server, root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
