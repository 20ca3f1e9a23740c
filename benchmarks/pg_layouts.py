"""What a lock cycle costs on PostgreSQL for six ways of storing a lease, side by side.

The question it answers (docs/coordinator-postgres.md, "Cost"): how close to a
plain lease row can a coordinator come that also writes its lease history in
the same commit, and how much of the gap is the coordinator's own layout?

A lock cycle is a grant and a release: two autocommit statements (two
commits, each durable), each a prepared statement on one connection per
client process, on one scope per process. The layouts:

- ``lease-row``: one row per held lease, inserted by the grant (or taken over
  when it has expired) and deleted by the release; the token from a sequence.
  No history, no queue, no lock-delay, no failover epoch.
- ``lease-row+event``: the same, each statement also appending one event
  (one row, one index) in its own commit: the least a history costs.
- ``scope-row-floor``: the lease kept in its scope's row (the token is that
  row's last token plus one; the lock-delay and a count of waiters in the row
  too, so that one statement decides), written in place: only the primary key
  is indexed, so each statement is one heap-only update. No history and none of
  the rules' reads: the least a layout with a token per scope writes.
- ``scope-row-complete``: the same with what the coordinator's rules need: the
  timeline against the recorded one, the epoch and forgotten floor under the
  token, the size bound on held leases, and each event an in-place update of
  one of the scope's 100 history slots. A release names its scope.
- ``scope-row-by-id``: ``scope-row-complete`` with a unique index on the lease
  id, so that a release needs only the lease id (as the coordinator port's
  ``release(lease_id)`` does today); each write then adds an index entry.
- ``stockade``: the coordinator's server functions as they are
  (``stockade_coord_grant_10``, ``stockade_coord_keep_10``: the lease log of
  schema 9), called directly. Run this script from a checkout of an older
  version for its layout (schema 8: ``stockade_coord_grant``, ``stockade_coord_keep``).

With ``--breakdown``, four more: ``stockade-no-lock``, ``-no-bound``,
``-no-timeline`` and ``-no-async``, the same functions each without one part of their work (the
scope's lock on its view, the bound on held leases, the timeline check; the history
is the lease's own row since schema 9, nothing to take out): what each part costs a cycle. They are
unsafe as rules and exist only here, except ``-no-async``: the release that waits for its WAL flush,
as up to schema 11 (what not waiting gains).

Each run measures every layout once, in an order rotated run after run, with 1
client and with N client processes; the table gives the medians of cycles per
second, their ratio to ``lease-row``, and the CPU per cycle of the client
processes and of their PostgreSQL backends (read from ``/proc``: the server runs
on this host) and of the server's other processes (the WAL writer flushes what a
commit that does not wait leaves), and the WAL written per cycle, in bytes and in records (read with
``pg_walinspect``; unlike a time, these do not depend on how busy the host is).
It starts its own PostgreSQL 15 with durable settings on a free loopback port
in a temporary directory, and stops it.

    PYTHONPATH=src python benchmarks/pg_layouts.py --runs 5 --seconds 4 --clients 8 [--breakdown]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import Servers  # noqa: E402  (the servers it starts, and how)

from stockade.coordinators.postgres._rows import (  # noqa: E402
    _NEW_TIMELINE,
    LEASE_ROWS_AT_LEAST,
    LEASE_ROWS_MAX,
    LOCK_SCHEMA,
    RELEASE_ASYNC_LEAN,
    RULE_NAMES,
    SERVER_RULES,
)
from stockade.core.limits import LEASES_MAX  # noqa: E402
from stockade.core.tokens import COUNTER_BITS, COUNTER_MAX  # noqa: E402

_NOW = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint"
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
WARM_UP_CYCLES = 20

SETUP = """
CREATE SEQUENCE IF NOT EXISTS bench_token_seq;
CREATE TABLE IF NOT EXISTS bench_lease (scope text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,
                                        expires_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS bench_event (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, scope text NOT NULL,
                                        kind text NOT NULL, token bigint NOT NULL);
CREATE TABLE IF NOT EXISTS bench_meta (id int PRIMARY KEY CHECK (id = 1), timeline bigint NOT NULL,
                                       timeline_offset bigint NOT NULL, epoch bigint NOT NULL,
                                       forgotten_floor bigint NOT NULL);
INSERT INTO bench_meta VALUES (1, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
                               0, 1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS bench_scope (scope text PRIMARY KEY, last_token bigint NOT NULL,
                                        delay_until_ns bigint NOT NULL DEFAULT 0, waiting int NOT NULL DEFAULT 0,
                                        events bigint NOT NULL DEFAULT 0, lease_id text, holder text, token bigint,
                                        ttl_ms bigint, granted_ns bigint, expires_ns bigint) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS bench_scope_by_id (LIKE bench_scope INCLUDING DEFAULTS, PRIMARY KEY (scope),
                                              UNIQUE (lease_id)) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS bench_slot (scope text NOT NULL, slot int NOT NULL, n bigint NOT NULL, kind text NOT NULL,
                                       holder text NOT NULL, token bigint NOT NULL, at_ms bigint NOT NULL,
                                       PRIMARY KEY (scope, slot)) WITH (fillfactor = 50);
"""

_LEASE_GRANT = ("INSERT INTO bench_lease AS l (scope, holder, token, expires_at) "
                "VALUES (%(scope)s, %(holder)s, nextval('bench_token_seq'), now() + interval '10 seconds') "
                "ON CONFLICT (scope) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
                "expires_at = excluded.expires_at WHERE l.expires_at < now() RETURNING l.token, l.scope")
_LEASE_RELEASE = "DELETE FROM bench_lease WHERE scope = %(scope)s AND token = %(token)s RETURNING token, scope"


def _with_event(statement: str, kind: str) -> str:
    return (f"WITH c AS ({statement}), e AS (INSERT INTO bench_event (scope, kind, token) "
            f"SELECT c.scope, '{kind}', c.token FROM c) SELECT c.token FROM c")


# The lease kept in its scope's row, written in place: only the primary key is indexed and the pages keep
# room (fillfactor 50), so a grant and a release are each one heap-only update (no index entry written).
# The rules' reads, as the coordinator needs them: the timeline against the one it recorded (a
# promotion), the epoch and forgotten floor under the token, the size bound on held leases, the
# count of waiters and the lock-delay in the row itself.
_TIMELINE = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"
# The coordinator's own size check (heap and primary key), on the layout's table.
_UNDER_BOUND = f"{LEASE_ROWS_MAX} < {LEASES_MAX}".replace("stockade_coord_scopes", "{table}")
_BASE = f"GREATEST(s.last_token, m.epoch << {COUNTER_BITS}, m.forgotten_floor)"


def _scope_ring(kind: str) -> str:
    """The event as an in-place update of one of the scope's 100 slots (inserted the first time round)."""
    return (f"r AS (UPDATE bench_slot AS r SET n = c.events, kind = '{kind}', holder = c.holder, token = c.token, "
            "at_ms = c.now / 1000000 FROM c WHERE r.scope = c.scope AND r.slot = c.events %% 100 RETURNING 1), "
            "ri AS (INSERT INTO bench_slot (scope, slot, n, kind, holder, token, at_ms) "
            f"SELECT c.scope, c.events %% 100, c.events, '{kind}', c.holder, c.token, c.now / 1000000 FROM c "
            "WHERE NOT EXISTS (SELECT 1 FROM r)) ")


def _scope_grant(table: str, *, rules: bool, history: bool) -> str:
    checks = (f" AND m.timeline = {_TIMELINE} + m.timeline_offset AND {_BASE} & {COUNTER_MAX} <> {COUNTER_MAX}"
              f" AND {_UNDER_BOUND.format(table=table)}") if rules else ""
    base = _BASE if rules else "s.last_token"
    return (
        "WITH m AS (SELECT * FROM bench_meta WHERE id = 1), "
        f"n AS (SELECT {_NOW} AS now), "
        f"c AS (UPDATE {table} AS s SET last_token = {base} + 1, token = {base} + 1, events = s.events + 1, "
        "lease_id = %(lease_id)s, holder = %(holder)s, ttl_ms = %(ttl_ms)s::bigint, granted_ns = n.now, "
        "expires_ns = n.now + %(ttl_ms)s::bigint * 1000000 FROM m, n "
        "WHERE s.scope = %(scope)s AND s.lease_id IS NULL AND s.waiting = 0 AND s.delay_until_ns <= n.now"
        f"{checks} RETURNING s.scope, s.holder, s.token, s.events, n.now)"
        + (", " + _scope_ring("grant") if history else " ") + "SELECT c.token FROM c")


def _scope_release(table: str, *, by_id_only: bool, rules: bool, history: bool) -> str:
    where = "" if by_id_only else "s.scope = %(scope)s AND "
    checks = f" AND m.timeline = {_TIMELINE} + m.timeline_offset" if rules else ""
    return (
        "WITH m AS (SELECT * FROM bench_meta WHERE id = 1), "
        f"n AS (SELECT {_NOW} AS now), "
        f"c AS (UPDATE {table} AS s SET lease_id = NULL, events = s.events + 1 FROM m, n "
        f"WHERE {where}s.lease_id = %(lease_id)s AND s.waiting = 0 AND n.now < s.expires_ns{checks} "
        "RETURNING s.scope, s.holder, s.token, s.events, n.now)"
        + (", " + _scope_ring("release") if history else " ") + "SELECT c.token FROM c")


_STOCKADE_GRANT = ("SELECT token FROM stockade_coord_grant_10(%(scope)s, %(lease_id)s, %(holder)s, %(ttl_ms)s, "
                   "100000)")
_STOCKADE_RELEASE = "SELECT token FROM stockade_coord_keep_10(%(lease_id)s, true)"

#: layout -> (grant, release); each answers one row when it did its work.
LAYOUTS: dict[str, tuple[str, str]] = {
    "lease-row": (_LEASE_GRANT, _LEASE_RELEASE),
    "lease-row+event": (_with_event(_LEASE_GRANT, "grant"), _with_event(_LEASE_RELEASE, "release")),
    "scope-row-floor": (_scope_grant("bench_scope", rules=False, history=False),
                        _scope_release("bench_scope", by_id_only=False, rules=False, history=False)),
    "scope-row-complete": (_scope_grant("bench_scope", rules=True, history=True),
                           _scope_release("bench_scope", by_id_only=False, rules=True, history=True)),
    "scope-row-by-id": (_scope_grant("bench_scope_by_id", rules=True, history=True),
                        _scope_release("bench_scope_by_id", by_id_only=True, rules=True, history=True)),
    "stockade": (_STOCKADE_GRANT, _STOCKADE_RELEASE),
}


def _stockade_without(part: str) -> str:
    """The coordinator's two functions with one part of their work taken out, renamed (for measuring only)."""
    lines = SERVER_RULES.splitlines()
    if part == "lock":  # the scope's lock, on its view (each client uses its own scope here)
        rules = "\n".join(line for line in lines if f"LOCK TABLE {LOCK_SCHEMA}." not in line)
    elif part == "bound":  # the bound on held leases
        rules = SERVER_RULES.replace(LEASE_ROWS_AT_LEAST.format(n="p_leases_max"), "false")
    elif part == "timeline":  # the check of the timeline against the recorded one
        rules = SERVER_RULES.replace(_NEW_TIMELINE, "false")
    elif part == "async":  # the release's commit without waiting for its flush: it waits, as up to schema 11
        rules = SERVER_RULES.replace(RELEASE_ASYNC_LEAN, "")
    else:
        raise ValueError(part)
    if rules == SERVER_RULES:
        raise RuntimeError(f"the coordinator's functions changed: no {part} found to take out")
    return (rules.replace(f"{RULE_NAMES[0]}(", f"bench_grant_no_{part}(")
            .replace(f"{RULE_NAMES[1]}(", f"bench_keep_no_{part}("))


#: ``--breakdown``: the coordinator's functions, each time without one part: what that part costs a cycle.
BREAKDOWN: dict[str, tuple[str, str]] = {
    f"stockade-no-{part}": (_STOCKADE_GRANT.replace(f"{RULE_NAMES[0]}(", f"bench_grant_no_{part}("),
                            _STOCKADE_RELEASE.replace(f"{RULE_NAMES[1]}(", f"bench_keep_no_{part}("))
    for part in ("lock", "bound", "timeline", "async")
}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime + stime


def _aux_cpu_s(dsn: str) -> dict[int, float]:
    """CPU so far of the server's processes other than client backends (the WAL writer, which writes and
    flushes the WAL of the commits that do not wait for it, the checkpointer, ...), by pid."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'")]
    out = {}
    for pid in pids:
        try:
            out[pid] = _cpu_s(pid)
        except OSError:  # gone meanwhile
            pass
    return out


def _cycle(conn, grant: str, release: str, scope: str, holder: str) -> None:
    params = {"scope": scope, "lease_id": uuid.uuid4().hex, "holder": holder, "ttl_ms": 10_000}
    row = conn.execute(grant, params, prepare=True).fetchone()
    if row is None:
        raise RuntimeError(f"not granted: {scope}")
    params["token"] = row[0]
    if conn.execute(release, params, prepare=True).fetchone() is None:
        raise RuntimeError(f"not released: {scope}")


def _client(layout: str, dsn: str, scope: str, seconds: float, barrier, results) -> None:
    try:
        _measure_client(layout, dsn, scope, seconds, barrier, results)
    except BaseException as exc:  # the parent reports it (instead of waiting for this process's figures)
        barrier.abort()
        results.put(f"{type(exc).__name__}: {exc}")
        raise


def _measure_client(layout: str, dsn: str, scope: str, seconds: float, barrier, results) -> None:
    import psycopg

    grant, release = LAYOUTS[layout]
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        holder = uuid.uuid4().hex
        for table in ("bench_scope", "bench_scope_by_id"):  # a used scope (its first grant is the engine's)
            conn.execute(f"INSERT INTO {table} (scope, last_token) VALUES (%s, 0) ON CONFLICT DO NOTHING", (scope,))
        for _ in range(WARM_UP_CYCLES):
            _cycle(conn, grant, release, scope, holder)
        barrier.wait()
        cycles, start, cpu0, server0 = 0, time.perf_counter(), time.process_time(), _cpu_s(backend)
        while time.perf_counter() - start < seconds:
            _cycle(conn, grant, release, scope, holder)
            cycles += 1
        results.put((cycles, time.perf_counter() - start, time.process_time() - cpu0, _cpu_s(backend) - server0))


def _wal_lsn(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return str(conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])


def _wal_per_cycle(dsn: str, start: str, end: str, cycles: int) -> tuple[float, float]:
    """WAL bytes and records per cycle between two LSNs (the whole server's: this benchmark's own server)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        records, size = conn.execute("SELECT sum(count), sum(combined_size) FROM pg_get_wal_stats(%s, %s)",
                                     (start, end)).fetchone()
    return int(size or 0) / cycles, int(records or 0) / cycles


def measure(layout: str, dsn: str, clients: int, seconds: float, run: int) -> dict:
    """One run of ``layout``: ``clients`` processes for ``seconds``; cycles/s, CPU µs and WAL per cycle."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(layout, dsn, f"{layout}-{run}-{i}", seconds, barrier, results))
             for i in range(clients)]
    for p in procs:
        p.start()
    wal_start = _wal_lsn(dsn)  # the clients warm up before the barrier: some of theirs is counted (20 of thousands)
    aux_start = _aux_cpu_s(dsn)
    got = [results.get(timeout=seconds + 120) for _ in procs]
    aux_end = _aux_cpu_s(dsn)
    wal_end = _wal_lsn(dsn)
    for p in procs:
        p.join(30)
    failed = [g for g in got if isinstance(g, str)]
    if failed:
        raise RuntimeError(f"{layout}, {clients} clients: {failed[0]}")
    cycles = sum(g[0] for g in got)
    wal_bytes, wal_records = _wal_per_cycle(dsn, wal_start, wal_end, cycles + clients * WARM_UP_CYCLES)
    return {"layout": layout, "clients": clients, "run": run, "cycles": cycles,
            "wal_bytes": wal_bytes, "wal_records": wal_records,
            "per_s": cycles / max(g[1] for g in got),
            "client_cpu_us": sum(g[2] for g in got) / cycles * 1e6,
            "server_cpu_us": sum(g[3] for g in got) / cycles * 1e6,
            "aux_cpu_us": sum(aux_end[pid] - aux_start[pid] for pid in aux_end.keys() & aux_start.keys())
            / cycles * 1e6}


def table(rows: list[dict], clients: list[int]) -> str:
    out = ["| layout | clients | runs | cycles/s (median) | ratio to lease-row | client CPU µs/cycle "
           "| server CPU µs/cycle | other server processes µs/cycle | WAL bytes/cycle | WAL records/cycle |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for n in clients:
        base = statistics.median(r["per_s"] for r in rows if r["layout"] == "lease-row" and r["clients"] == n)
        for layout in LAYOUTS:
            mine = [r for r in rows if r["layout"] == layout and r["clients"] == n]
            per_s = statistics.median(r["per_s"] for r in mine)
            out.append(f"| {layout} | {n} | {len(mine)} | {per_s:.0f} | {per_s / base:.2f}x | "
                       f"{statistics.median(r['client_cpu_us'] for r in mine):.0f} | "
                       f"{statistics.median(r['server_cpu_us'] for r in mine):.0f} | "
                       f"{statistics.median(r['aux_cpu_us'] for r in mine):.0f} | "
                       f"{statistics.median(r['wal_bytes'] for r in mine):.0f} | "
                       f"{statistics.median(r['wal_records'] for r in mine):.1f} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=8, help="client processes of the second phase (first: 1)")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--breakdown", action="store_true",
                        help="also the coordinator's functions without, in turn, their history, advisory lock, "
                             "bound on leases and timeline check (measurement only)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 50 or not 0.5 <= args.seconds <= 60 or not 2 <= args.clients <= 64:
        parser.error("--runs 1..50, --seconds 0.5..60, --clients 2..64")
    root = Path(tempfile.mkdtemp(prefix="stockade-pg-layouts-"))
    servers = Servers(root)
    try:
        port = servers.start_postgres()
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        import psycopg

        import stockade

        stockade.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres").close()  # its tables and functions
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")  # the WAL per cycle (PostgreSQL 15)
            conn.execute(SETUP)
            if args.breakdown:
                for name in BREAKDOWN:
                    conn.execute(_stockade_without(name.removeprefix("stockade-no-")))
                LAYOUTS.update(BREAKDOWN)
        names, rows = list(LAYOUTS), []
        for run in range(args.runs):
            for clients in (1, args.clients):
                for layout in names[run % len(names):] + names[:run % len(names)]:
                    rows.append(measure(layout, dsn, clients, args.seconds, run))
                    r = rows[-1]
                    print(f"run {run} clients {clients} {layout:16s} {r['per_s']:7.0f}/s  client "
                          f"{r['client_cpu_us']:5.0f} µs  server {r['server_cpu_us']:5.0f} µs  other "
                          f"{r['aux_cpu_us']:4.0f} µs  WAL "
                          f"{r['wal_bytes']:5.0f} B {r['wal_records']:4.1f} records", flush=True)
        print(table(rows, [1, args.clients]))
        if args.json:
            args.json.write_text(json.dumps({"runs": rows}, indent=1))
    finally:
        servers.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
