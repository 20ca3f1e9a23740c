#!/usr/bin/env python3
"""A fenced single-row PostgreSQL transaction beside the plain one, in one run, on this machine.

Starts PostgreSQL 15 on a free loopback port in a temporary directory with
durable settings (fsync=on, synchronous_commit=on: the defaults; as root it
runs as the ``postgres`` user), installs the fence, and times, round after
round, alternated transaction by transaction (in a rotating order) so that the
load of a shared machine hits every variant alike:

* ``plain``: ``BEGIN; INSERT ... ON CONFLICT DO UPDATE (one row); COMMIT``
* ``fenced``: the same inside ``with fenced(conn, token)`` (one more statement,
  ``SELECT stockade.fence(...)``, in the same transaction; the MAC is checked by
  the database)
* ``fenced+keys``: the same with ``keys=`` (the MAC is also checked in Python first)
* ``protected``: ``fenced`` on a table under `protect` (its trigger checks again)
* ``fenced-advisory``: ``fenced`` in a second database of the same server, where
  the fence is schema 1's function (advisory locks, which any role may take;
  the private seam `_postgres_sql.FENCE_BODIES`): the side by side of the
  row-lock function with the one it replaced

* ``fenced-now`` and ``fenced-before`` (with ``--before SRC``, another checkout's ``src``,
  e.g. from ``git archive``): ``fenced``'s own steps (`stockade.resources.postgres._fenced`)
  on the same connection, calling ``stockade.fence`` and ``stockade.fence_before``, that
  revision's check defined beside it, so a change of the function is measured before and
  after in one run on one backend. (Another backend runs colder: measured, a check on a
  connection of its own cost 30-80 us more server CPU than on the shared one.)

each transaction of one variant followed by one of each other variant, and
prints the median over rounds of each variant's throughput and p50/p99
latency, with the ratio to ``plain``, and its CPU per transaction: its
backend's (``/proc/<pid>/schedstat``, so the server must run on this machine)
and this client's, with the ratio of their sum to ``plain``'s. The CPU moves
less with the host's load than the time does, which a busy disk's fsyncs
decide.

    PYTHONPATH=src python benchmarks/fence_postgres.py --rounds 7 --ops 2000
    mkdir /tmp/before && git archive main src | tar -x -C /tmp/before
    PYTHONPATH=src python benchmarks/fence_postgres.py --rounds 7 --ops 2000 --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.resources.postgres._fenced import _begin_and_fence, _prepare
from stockade.resources.postgres._sync import fence as sync_fence

PG_BIN = Path("/usr/lib/postgresql/15/bin")
CLUSTER = "be4c4be4c4be4c4b"
ROWS = 1000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def start_postgres(root: Path, *, wrapper: tuple[str, ...] = (),
                   settings: tuple[str, ...] = ("fsync=on", "synchronous_commit=on"),
                   start_s: float = 60, poll_s: float = 0.1) -> tuple[subprocess.Popen[bytes], str]:
    """A fresh PostgreSQL 15 in ``root/data`` on a free loopback port, its server run by ``wrapper`` (e.g.
    valgrind) with ``settings`` (``-c`` each); returns the process and a dsn once it answers."""
    shutil.chown(root, "postgres", "postgres") if os.geteuid() == 0 else None
    data = root / "data"
    subprocess.run([*as_postgres(), str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                    "-E", "UTF8", "--locale", "C"], check=True, capture_output=True, cwd="/")
    port = free_port()
    options = [arg for setting in ("listen_addresses=127.0.0.1", f"port={port}", "unix_socket_directories=",
                                   *settings) for arg in ("-c", setting)]
    with open(root / "server.log", "ab") as log:
        server = subprocess.Popen([*as_postgres(), *wrapper, str(PG_BIN / "postgres"), "-D", str(data), *options],
                                  stdout=log, stderr=subprocess.STDOUT, cwd="/")
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        try:
            psycopg.connect(dsn).close()
            return server, dsn
        except psycopg.OperationalError:
            time.sleep(poll_s)
    raise RuntimeError(f"PostgreSQL did not start{' under ' + wrapper[0] if wrapper else ''}")


@contextmanager
def fenced_by(conn: psycopg.Connection, token: str, function: str) -> Iterator[None]:
    """What `fenced` does on an idle autocommit connection, with the check's function named: the same
    client steps for ``stockade.fence`` and ``stockade.fence_before``."""
    fencing_token, scope = _prepare(token, None, None)
    query = _begin_and_fence(fencing_token, scope).replace("stockade.fence(", f"{function}(", 1)
    sync_fence._begin_and_check(conn, query)
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def variants(conn: psycopg.Connection, keys: FixedKeys, advisory: psycopg.Connection,
             before: bool = False) -> dict[str, Callable[[int], None]]:
    token = keys.sign(FencingToken(CLUSTER, "orders", 7)).encode()
    upsert = ("INSERT INTO {t} (id, state) VALUES (%s, 'paid') "
              "ON CONFLICT (id) DO UPDATE SET state = excluded.state")

    def plain(i: int) -> None:
        with conn.transaction():
            conn.execute(upsert.format(t="plain_orders"), (i % ROWS,))

    def fenced(i: int) -> None:
        with pg.fenced(conn, token):
            conn.execute(upsert.format(t="fenced_orders"), (i % ROWS,))

    def fenced_keys(i: int) -> None:
        with pg.fenced(conn, token, keys=keys):
            conn.execute(upsert.format(t="fenced_orders"), (i % ROWS,))

    def protected(i: int) -> None:
        with pg.fenced(conn, token):
            conn.execute(upsert.format(t="protected_orders"), (i % ROWS,))

    def fenced_advisory(i: int) -> None:
        with pg.fenced(advisory, token):
            advisory.execute(upsert.format(t="fenced_orders"), (i % ROWS,))

    def by(function: str) -> Callable[[int], None]:
        def op(i: int) -> None:
            with fenced_by(conn, token, function):
                conn.execute(upsert.format(t="fenced_orders"), (i % ROWS,))
        return op

    ops = {"plain": plain, "fenced": fenced, "fenced+keys": fenced_keys, "protected": protected,
           "fenced-advisory": fenced_advisory}
    if before:
        ops["fenced-now"] = by("stockade.fence")
        ops["fenced-before"] = by("stockade.fence_before")
    return ops


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def install_before(conn: psycopg.Connection, src: str) -> None:
    """Another checkout's check, defined beside the installed one as ``stockade.fence_before``.

    Its ``_sql.py`` is loaded with that checkout's ``_supersede.py`` in place of this one's (the
    check's text takes pieces from it); the helpers it calls (``stockade_private.*``) are this
    install's, which keep their names and arguments."""
    folder = Path(src) / "stockade" / "resources" / "postgres"
    name = "stockade.resources.postgres._supersede"
    saved = sys.modules[name]
    try:
        _load(folder / "_supersede.py", name)
        module = _load(folder / "_sql.py", "fence_sql_before")
    finally:
        sys.modules[name] = saved
    schema = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                          "ON n.oid = e.extnamespace WHERE e.extname = 'pgcrypto'").fetchone()[0]
    text = module.fence_function(pgcrypto_schema=schema, stale_when=module.STALE_WHEN["decide"])
    start = text.index("CREATE OR REPLACE FUNCTION stockade.fence(")
    end = text.index("$fence$;", start) + len("$fence$;")
    conn.execute(text[start:end].replace("stockade.fence(", "stockade.fence_before(")
                 .replace("fence.scope", "fence_before.scope"))


def backend_cpu_ns(pid: int) -> int:
    """The run time of a local backend so far (``/proc/<pid>/schedstat``: readable as root or as its user)."""
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def run_round(ops: dict[str, Callable[[int], None]], count: int,
              backends: dict[str, int]) -> dict[str, tuple[float, ...]]:
    """One round: ``count`` transactions of every variant, alternated one by one (the order rotates).

    Alternating transaction by transaction puts every variant under the same load, which
    matters on a shared machine where the load drifts within seconds. Each variant's figures:
    transactions/s, p50 and p99 µs, and the CPU per transaction of its backend (``backends``:
    its pid) and of this client, read around each transaction (outside the time taken).
    """
    names = list(ops)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    server_ns = dict.fromkeys(names, 0)
    client_s = dict.fromkeys(names, 0.0)
    for i in range(count):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            b0, c0 = backend_cpu_ns(backends[name]), time.process_time()
            t0 = time.perf_counter()
            ops[name](i)
            latencies[name].append(time.perf_counter() - t0)
            client_s[name] += time.process_time() - c0
            server_ns[name] += backend_cpu_ns(backends[name]) - b0
    out: dict[str, tuple[float, ...]] = {}
    for name, values in latencies.items():
        values.sort()
        out[name] = (count / sum(values), values[len(values) // 2] * 1e6, values[int(len(values) * 0.99)] * 1e6,
                     server_ns[name] / count / 1000, client_s[name] / count * 1e6)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them); >= 5")
    parser.add_argument("--ops", type=int, default=2000, help="transactions per variant per round")
    parser.add_argument("--before", help="another checkout's src: adds fenced-now and fenced-before")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-pg-"))
    os.chmod(root, 0o755)
    server, dsn = start_postgres(root)
    try:
        keys = FixedKeys(ephemeral_keyring(CLUSTER))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_advisory")
        advisory = psycopg.connect(dsn.replace("dbname=postgres", "dbname=bench_advisory"), autocommit=True)
        pg._install(advisory, keys.keyring, CLUSTER, q.STALE_WHEN["decide"], body="advisory")
        advisory.execute("CREATE TABLE fenced_orders (id int PRIMARY KEY, state text NOT NULL)")
        with psycopg.connect(dsn, autocommit=True) as conn:
            pg.install(conn, keys=keys)
            pg.install_ddl_guard(conn)  # the benchmark's server runs as its superuser
            for table in ("plain_orders", "fenced_orders", "protected_orders"):
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, state text NOT NULL)")
            pg.protect(conn, "protected_orders", scope="orders")
            if args.before:
                install_before(conn, args.before)
            settings = conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                    "('fsync', 'synchronous_commit', 'wal_sync_method')").fetchall()
            ops = variants(conn, keys, advisory, bool(args.before))
            backends = {name: advisory.info.backend_pid if name == "fenced-advisory" else conn.info.backend_pid
                        for name in ops}
            run_round(ops, 200, backends)  # warm up (prepared statements, caches)
            results: dict[str, list[tuple[float, ...]]] = {name: [] for name in ops}
            for _ in range(args.rounds):
                for name, figures in run_round(ops, args.ops, backends).items():
                    results[name].append(figures)
        print(f"PostgreSQL 15, {', '.join(f'{n}={v}' for n, v in settings)}; one client, "
              f"{args.ops} single-row transactions per variant per round, {args.rounds} interleaved rounds "
              f"(medians); python {sys.version.split()[0]}")
        base = statistics.median(r[0] for r in results["plain"])
        base_p50 = statistics.median(r[1] for r in results["plain"])
        base_cpu = statistics.median(r[3] + r[4] for r in results["plain"])
        print("| variant | tx/s | p50 µs | p99 µs | time per tx vs plain (tx/s) | p50 vs plain "
              "| server CPU µs/tx | client CPU µs/tx | CPU vs plain |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, rounds in results.items():
            rate = statistics.median(r[0] for r in rounds)
            p50 = statistics.median(r[1] for r in rounds)
            p99 = statistics.median(r[2] for r in rounds)
            backend, client = statistics.median(r[3] for r in rounds), statistics.median(r[4] for r in rounds)
            cpu = statistics.median(r[3] + r[4] for r in rounds)
            print(f"| {name} | {rate:.0f} | {p50:.0f} | {p99:.0f} | {base / rate:.3f}x | {p50 / base_p50:.3f}x "
                  f"| {backend:.0f} | {client:.0f} | {cpu / base_cpu:.3f}x |")
    finally:
        subprocess.run([*as_postgres(), str(PG_BIN / "pg_ctl"), "stop", "-D", str(root / "data"), "-m", "fast"],
                       capture_output=True, cwd="/")
        server.wait(60)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
