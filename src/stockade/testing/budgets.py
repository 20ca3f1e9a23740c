"""The work one operation may cost: counts, each in one place, checked by tests/test_work_budget.py.

Counts, not times, so that a shared machine's noise is not in them, and a
change that makes the hot path do more fails the day it lands (the history
journal's extra pages would have). Each figure is per operation, the mean over
a run of them (tests/helpers/work_budget.py says how each is counted):

- ``commits``: COMMITs that reached the WAL; each is one fdatasync (``synchronous=FULL``).
- ``log_appends`` / ``log_bytes`` / ``folds``: a server's record log (``coord.log``): frames appended (one
  fdatasync each), their bytes, and folds of the log into the coordinator file.
- ``wal_frames`` / ``wal_bytes``: pages written to the WAL, and their bytes.
- ``statements``: SQL statements on the file's connection, BEGIN and COMMIT included.
- ``calls``: Python and C function calls on the server's event loop thread
  (``stockade serve``) or on the caller's thread (embedded), client included there.
- ``wal_records``: PostgreSQL WAL records of the coordinator's own tables, commits included
  (tests/test_postgres_wal_per_cycle.py reads them with ``pg_walinspect``); for a fenced
  transaction, every record of the transaction.
- ``statements`` of ``postgres.lock_cycle_server``: the statements PostgreSQL runs, nested ones (inside
  the coordinator's functions) included.
- ``round_trips``: queries sent and answered (a commit is one), each a wait of psycopg's connection.

A budget may go down in the change that earns it; raising one is a decision,
said in its commit with the benchmark's figures (`stockade bench`,
benchmarks/side_by_side.py).
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["BUDGETS", "BENCHMARK", "over_budget"]

BENCHMARK = ("`stockade bench --url http://...` against `stockade serve`, and benchmarks/side_by_side.py "
             "for the peers, side by side")

#: operation -> measure -> at most this much per operation.
BUDGETS = MappingProxyType({
    # acquire -> release through `stockade serve` (1 client): two durable commits. Each commit writes 4 pages
    # of 1 KiB (the journal's row and its by-scope entry, the scope's row, its lease-id entry; 0.15 more for
    # the journal's page splits) and runs 4 statements; 0.1 more is the journal's trims, run in batches (a
    # run of 20 cycles meets at most one of each). Before: 13 pages of 4 KiB (53,560 B), 13 statements,
    # 1,020.5 calls (the handler's reply future saves a loop turn per request, the commit's fast path the rest).
    # 764 calls measured (the hot path's trims of issue 29; 916.5 before them; 970 with debug logging on);
    # 742.6 after the committer's results went to the handlers without a call each (774 just before); 640 with
    # acquire and release answered without a task (`Deferred`, called back in the commit's step); 633 (639.7
    # just before) with the release's debug line built only when it is written and the journal's trim period
    # inline; 588 (634 just before) with the request path's trims: the connection's idle / reading / serving moves
    # without a call, the usual request target, content type and JSON body taken without the general path, no
    # bytes given back for a bodiless request, the dashboard asked only about its own paths. Schema version 3
    # writes each event to the journal's recent table (no per-scope index; moved to the indexed table a hundred
    # events at a time): 6.15 pages measured in 20 cycles, 6.585 (6,901 B) over 200 cycles with the moves (8.515,
    # 8,924 B before). A release answered before its commit (issue 29; docs/rules.md, C3) rides with the next
    # grant's: one commit a cycle, of the two changes of the scope's row, 6 statements (BEGIN, two of each change,
    # COMMIT), 3.15 pages (3,301 B) in 20 cycles, 3.685 (3,862 B) over 200; 538 calls (585 with
    # ``--release-lag-ms 0``, the release waiting for its own commit as before), with the committer's lag timer
    # armed once a lag rather than once a release, a commit's listeners called without a call each, and a
    # release's queue pumped only when the scope has waiters. Measured
    # with a lag of a minute, so that the count does not depend on how soon the client's next acquire comes (with
    # the default 10 ms it is the same whenever it comes within them: 539-551 calls, the lag timer's re-arming
    # included, 1 commit).
    # Before the release lag: 440 calls (588 just before) with an acquire's values checked once: the engine's trusted
    # entry for the server's validated acquire (`AcquireRequest.prevalidated`), tokens built unchecked where
    # their fields cannot be invalid, the validators' usual case in one test, and the request path's lookups
    # and type tests without calls. 453 with that acquire checked again by the engine (the control
    # `_checked_again_served` of tests/test_work_budget.py), so the margin here is 8, not 10.
    # Both together: 395.1 calls (438 with ``--release-lag-ms 0``; 410 with the acquire checked again).
    # 391.2-392.0 (434 with ``--release-lag-ms 0``; 406 with the acquire checked again) with an answer's clock
    # read once (its metric and its connection's idle start) and the method's name found, not decoded; 392.0 with
    # a grant's listener called through the committer's one `_notify` (a copy of it inline saved that call).
    # The record log (issue 29; docs/coordinator-files.md): a batch of changes is one frame appended to
    # ``coord.log`` and one fdatasync, and the coordinator file is written only when the log is folded into it
    # (every 256 changes: 128 cycles). So a cycle is 1 append (the release's and the grant's records in one
    # frame, 186-188 B measured) and nothing in the file's WAL; 377.2 calls (392.0 with the acquire checked again;
    # 447.2 and 2 appends with ``--release-lag-ms 0``; 392.0 before, with a transaction of the file a batch).
    # What a fold costs, amortised: ``serve.lock_cycle_folded``.
    # 398.2 calls with a batch's one more turn of the loop before it commits (`_groupcommit.GATHER_TURNS`): the
    # 21 more are that turn run by asyncio's own loop in Python, as this in-process count runs it (`_run_once`,
    # its `select`, the ready queue); on uvloop, which `stockade serve` runs on with the server extra, the turn
    # is in C. The turn is there for 8 client processes: 0.24 fsyncs a cycle instead of 0.35, 0.90x the server's
    # CPU a cycle (benchmarks/serve_ab.py, 5 runs).
    "serve.lock_cycle": MappingProxyType({
        "log_appends": 1, "log_bytes": 200, "folds": 0, "commits": 0, "wal_frames": 0, "wal_bytes": 0,
        "statements": 0, "calls": 406}),
    # the same cycle with the log folded every 40 changes (one fold in the 20 cycles measured), so that the
    # fold's work is in the figures: each change's history events (2 statements a cycle) and each scope's row
    # once, in one transaction (BEGIN, meta, COMMIT): 2.35 statements, 0.45 pages (472 B), 0.05 commits and
    # 389.4 calls a cycle measured (the fold runs on the loop). At the server's threshold of 256 changes the
    # per-fold part is 6.4 times smaller. 387.7 calls with the fold's
    # events inserted with one executemany a move (statements as counted here: 2.4, as before).
    "serve.lock_cycle_folded": MappingProxyType({
        "log_appends": 1, "log_bytes": 200, "folds": 0.05, "commits": 0.05, "wal_frames": 0.6, "wal_bytes": 620,
        "statements": 2.5, "calls": 416}),  # 408.7 with the batch's one more turn (as ``serve.lock_cycle``)
    # one fenced put (100 bytes) through `stockade serve`'s store. Before the handler's reply future: 521.5 calls;
    # 459 measured (487 before issue 29's trims; 523 with debug logging on); 454.6 with the committer's trims;
    # 446.6 with the answers' heads made once and the C JSON encoder built once; 424.7 (442 just before) with the
    # request path's trims of ``serve.lock_cycle``; 391.8 with its acquire's values checked once; 389.9 with an
    # answer's clock read once and the method's name found, not decoded (393.0 just before); 391.0 with the
    # commit's listeners called through `_notify`; 410.9 with the batch's one more turn (as ``serve.lock_cycle``).
    "serve.fenced_write": MappingProxyType({
        "commits": 1, "wal_frames": 4, "wal_bytes": 16_480, "statements": 11, "calls": 419}),
    # acquire -> release on an embedded ``sqlite://`` coordinator.
    # Before: 13 pages (53,560 B), 22 statements, 425 calls; 353 calls measured (385 before issue 29's trims);
    # 343 with the clock read in C and the lease states hashed in C (357 just before); 339 with the journal's
    # trim period inline; 258 with the validators' usual case in one test and tokens built unchecked where their
    # fields cannot be invalid. Pages: as ``serve.lock_cycle``'s (the journal's recent table, schema version 3).
    "embedded.lock_cycle": MappingProxyType({
        "commits": 2, "wal_frames": 6.7, "wal_bytes": 7_050, "statements": 15.1, "calls": 268}),
    # acquire -> release on the PostgreSQL coordinator: the lease log's row and its three index entries, the
    # scope row's last token, the row ended in place, two commits (docs/coordinator-postgres.md, "Cost").
    # 8 a cycle, one of slack for an index page split. Before the lease log (schema 8): 14 records.
    "postgres.lock_cycle": MappingProxyType({"wal_records": 9}),
    # the same cycle, the client's function calls on the caller's thread (two prepared calls, the lease signed):
    # 179 measured; the lease engine's path instead, 1,294 (tests/test_postgres_client_calls.py).
    "postgres.lock_cycle_client": MappingProxyType({"calls": 190}),
    # the same cycle, the statements the server runs (``pg_stat_statements``, nested ones included): the two
    # calls, the grant's lock, read and write, the release's read, lock and write (schema 13: its commit
    # setting and bound check are expressions). 10 in schema 12, whose release ran both as queries; 11 in
    # schema 11, whose functions locked through a nested call each (tests/test_postgres_statements_per_cycle.py).
    # Schema 14 runs the same 8, in fewer of the server's instructions (benchmarks/pg_cycle_ir.py: 761,500 a cycle,
    # 992,000 with schema 13's: docs/coordinator-postgres.md, "Where the time goes").
    "postgres.lock_cycle_server": MappingProxyType({"statements": 8}),
    # one fenced transaction on the user's PostgreSQL (`fenced` on an idle autocommit connection, a one-row
    # upsert of a row that exists, the commit): what the same transaction unfenced makes and writes. BEGIN and
    # the check go in one query (3 round trips: it, the upsert, COMMIT); the check's locks write nothing and an
    # equal token does not write the mark (3 WAL records: the upsert's row lock and update, the commit).
    # ``calls``: the client's, 113 measured (psycopg 3.3; the plain transaction 97): BEGIN and the check go
    # straight to the connection's pgconn; through a cursor, as before issue 29's trims, 161.
    # tests/test_fence_postgres_work.py; measure the time with benchmarks/fence_postgres.py.
    "postgres.fenced_write": MappingProxyType({"round_trips": 3, "wal_records": 3, "calls": 116}),
    # acquire -> release through `stockade serve`, the client's side: the calls on the caller's thread of the
    # sync client (keepalive off), tests/test_client_work_budget.py; measure the time with
    # benchmarks/client_cpu.py (beside psycopg's two statements). 244 before issue 29's client trims; 139 measured.
    "client.lock_cycle": MappingProxyType({"calls": 143}),
})


def over_budget(operation: str, measured: dict[str, float]) -> list[str]:
    """The measures of ``operation`` over their budget, each said with its figure (empty: within budget)."""
    budget = BUDGETS[operation]
    return [
        f"{operation}: {name} {measured[name]:g} per operation, over its budget of {limit:g} "
        f"(src/stockade/testing/budgets.py); measure the change with {BENCHMARK}"
        for name, limit in budget.items()
        if measured[name] > limit
    ]
