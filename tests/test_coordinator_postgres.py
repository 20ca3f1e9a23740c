"""The PostgreSQL coordinator (postgresql://) on real servers: failover, safety settings, native waiting.

The conformance suite runs on it from tests/conftest.py (``postgres``); this
file holds what only this backend has:

- **Failover (S15).** A primary streams to a standby; grants are made through
  a multi-host url (``target_session_attrs=read-write``); the primary is killed
  with SIGKILL and the standby promoted with ``pg_ctl promote``. With an
  *asynchronous* standby that was stopped first, the promoted server lost the
  last grants. Every token granted after the promotion must be above every
  token granted before (0 regressions), and the control, the same run with
  tokens that do not carry the timeline, must show regressions. With a
  *synchronous* standby nothing acknowledged is lost. A lease the new primary
  knows is held a full TTL after the failover (C3).
- **Refused settings.** ``fsync=off`` and ``synchronous_commit=off``.
- **Restore.** A database whose timeline is below the one its tables recorded
  (a copy restored without a promotion) is refused until ``timeline_offset``
  is raised, and its tokens then go on above the old ones.
- **Native waiting.** A waiter makes a handful of attempts while it waits, not
  one per poll interval; the control is the polling port over SQLite.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest

import stockade
from stockade.core.errors import BackendUnavailable, LockTimeout
from stockade.testing.servers import postgres as pg_helper

if not pg_helper.available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

from helpers.pg_cluster import Pair, promote  # noqa: E402 - psycopg and the binaries are there

from stockade.coordinators.postgres import PostgresRecords  # noqa: E402
from stockade.coordinators.postgres._rows import TIMELINE_KEY  # noqa: E402

SCOPES = ("a", "b", "c")
GRANTS_BEFORE_STOP = 5  # per scope: the standby replays these
GRANTS_LOST = 5  # per scope: acknowledged by the primary alone (the asynchronous standby is stopped)
GRANTS_AFTER = 12  # per scope, after the promotion
RETRIES_MAX = 400
HELD_TTL_MS = 30_000


def _retrying(action):
    """Run ``action`` until the coordinator answers (a failover breaks the open connections once each)."""
    for _ in range(RETRIES_MAX):
        try:
            return action()
        except BackendUnavailable:
            time.sleep(0.05)
    raise AssertionError("the coordinator did not come back")


def _grant(coord, scope: str) -> int:
    def once() -> int:
        lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=0, keepalive=False)
        lease.release()
        return lease.token.value

    return _retrying(once)


def _failover(*, synchronous: bool, timelines: bool, monkeypatch) -> tuple[int, int, dict]:
    """Grants, a kill -9 of the primary, a promotion, more grants; (regressions, grants after, facts)."""
    monkeypatch.setattr(PostgresRecords, "timelines", timelines)
    pair = Pair(synchronous=synchronous)
    try:
        coord = stockade.connect(pair.url)
        held = coord.acquire("held", ttl_ms=HELD_TTL_MS, keepalive=False)
        before: dict[str, list[int]] = {s: [] for s in SCOPES}
        for _ in range(GRANTS_BEFORE_STOP):
            for scope in SCOPES:
                before[scope].append(_grant(coord, scope))
        if not synchronous:
            pair.wait_replayed()
            pair.standby.stop()  # it falls behind: what an asynchronous standby may be when the primary dies
        for _ in range(GRANTS_LOST):
            for scope in SCOPES:
                before[scope].append(_grant(coord, scope))
        pair.primary.kill9()
        if not synchronous:
            pair.standby.start()
        promote(pair.standby)
        after: dict[str, list[int]] = {s: [] for s in SCOPES}
        for _ in range(GRANTS_AFTER):
            for scope in SCOPES:
                after[scope].append(_grant(coord, scope))
        regressions = sum(1 for s in SCOPES for value in after[s] if value <= max(before[s]))
        info = _retrying(lambda: coord.inspect("held"))
        with pytest.raises(LockTimeout):
            coord.acquire("held", ttl_ms=1_000, wait_ms=0)
        facts = {"held_state": info.state, "held_remaining_ms": info.remaining_ms, "held_token": info.token,
                 "lease_token": held.token.unsigned()}
        coord.close()
        return regressions, sum(len(v) for v in after.values()), facts
    finally:
        pair.close()


def test_async_failover_tokens_never_go_back(monkeypatch):
    regressions, grants, facts = _failover(synchronous=False, timelines=True, monkeypatch=monkeypatch)
    print(f"async standby, timeline in the token: {regressions} of {grants} grants after promotion regressed")
    assert regressions == 0 and grants >= 10
    # C3: the lease the new primary knows is held a full TTL from the failover.
    assert facts["held_state"] is stockade.ScopeState.HELD and facts["held_token"] == facts["lease_token"]
    assert facts["held_remaining_ms"] > HELD_TTL_MS - 10_000


def test_control_async_failover_without_timeline_regresses(monkeypatch):
    regressions, grants, _ = _failover(synchronous=False, timelines=False, monkeypatch=monkeypatch)
    print(f"control, async standby, no timeline in the token: {regressions} of {grants} grants regressed")
    assert regressions > 0


def test_sync_failover_tokens_never_go_back(monkeypatch):
    regressions, grants, facts = _failover(synchronous=True, timelines=True, monkeypatch=monkeypatch)
    print(f"sync standby: {regressions} of {grants} grants after promotion regressed")
    assert regressions == 0 and grants >= 10
    assert facts["held_state"] is stockade.ScopeState.HELD


def test_fsync_off_is_refused():
    server = pg_helper.PostgresServer({"fsync": "off"})
    try:
        with pytest.raises(BackendUnavailable, match="fsync=off"):
            stockade.connect(server.url())
    finally:
        server.close()


def test_synchronous_commit_off_is_refused_and_on_is_accepted(pg_coord_url):
    server = pg_helper.shared_server()
    name = pg_coord_url.rsplit("/", 1)[1]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    with pytest.raises(BackendUnavailable, match="synchronous_commit=off"):
        stockade.connect(pg_coord_url)
    with psycopg.connect(server.dsn, autocommit=True) as conn:  # the control: the same database, safe again
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    stockade.connect(pg_coord_url).close()


def test_restored_copy_below_its_timeline_is_refused_until_the_offset_is_raised(pg_coord_url):
    coord = stockade.connect(pg_coord_url)
    old = _grant(coord, "r")
    coord.close()
    server = pg_helper.shared_server()
    dsn = server.dsn_of(pg_coord_url.rsplit("/", 1)[1])
    with psycopg.connect(dsn, autocommit=True) as conn:  # what a logical restore into a fresh cluster looks like
        timeline = int(conn.execute("SELECT v FROM stockade_coord_meta WHERE k = %s", (TIMELINE_KEY,)).fetchone()[0])
        conn.execute("UPDATE stockade_coord_meta SET v = %s WHERE k = %s", (str(timeline + 3), TIMELINE_KEY))
    coord = stockade.connect(pg_coord_url)
    with pytest.raises(BackendUnavailable, match="timeline_offset"):
        coord.acquire("r", ttl_ms=1_000, wait_ms=0)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the documented step: an offset above the old timeline
        conn.execute("UPDATE stockade_coord_meta SET v = '4' WHERE k = 'timeline_offset'")
    new = _grant(coord, "r")
    assert new > old
    coord.close()


def _count_attempts(coord, scope: str, wait_ms: int) -> int:
    """How many times a waiter asked the coordinator while it waited ``wait_ms`` behind a holder."""
    port = coord._port
    engine = port.engine
    name = "attempt" if hasattr(engine, "attempt") else "try_acquire"
    calls = 0
    original = getattr(engine, name)

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    holder = coord.acquire(scope, ttl_ms=10_000, keepalive=False)
    setattr(engine, name, counted)
    try:
        with pytest.raises(LockTimeout):
            coord.acquire(scope, ttl_ms=1_000, wait_ms=wait_ms)
    finally:
        setattr(engine, name, original)
        holder.release()
    return calls


def test_waiting_is_woken_not_polled(pg_coord_url, tmp_path):
    coord = stockade.connect(pg_coord_url)
    attempts = _count_attempts(coord, "w", 1_500)
    coord.close()
    # The embedded engine's polling port: 1..20 ms steps.
    control = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    polled = _count_attempts(control, "w", 1_500)
    control.close()
    print(f"attempts while waiting 1.5 s: {attempts} (postgresql, notified) vs {polled} (sqlite, polled)")
    # Notified: a look every waiter_stale_ms / 4 (500 ms) keeps the place in the queue, plus the wakes of
    # the queue's own changes: 8 on a quiet machine, 9 seen under load. Polled: one every 1 to 20 ms.
    assert attempts <= 12
    assert polled > 30


def test_cli_lock_and_status_on_postgresql(pg_coord_url):
    import subprocess
    import sys

    from conftest import python_env

    env = {**python_env(), "PYTHONPATH": os.pathsep.join(["src", python_env()["PYTHONPATH"]])}
    cli = [sys.executable, "-m", "stockade"]
    locked = subprocess.run([*cli, "lock", "--url", pg_coord_url, "nightly", "--", "sh", "-c", "echo $STOCKADE_TOKEN"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert locked.returncode == 0, locked.stderr
    token = stockade.FencingToken.decode(locked.stdout.strip())
    status = subprocess.run([*cli, "status", "--url", pg_coord_url, "--json"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    rows = [__import__("json").loads(line) for line in status.stdout.splitlines()]
    assert [(r["scope"], r["state"], r["last_token"]) for r in rows] == [("nightly", "free", token.value)]


# -- side by side with a lease row (STOCKADE_LONG=1) --------------------------------------------

BENCH_S = 2.0
LEASE_ROW_SETUP = """
CREATE SEQUENCE IF NOT EXISTS bench_token;
CREATE TABLE IF NOT EXISTS bench_lease (name text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,
                                        expires_at timestamptz NOT NULL)
"""
LEASE_ROW_ACQUIRE = (
    "INSERT INTO bench_lease VALUES (%s, %s, nextval('bench_token'), clock_timestamp() + interval '10 s') "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
    "expires_at = excluded.expires_at WHERE bench_lease.expires_at < clock_timestamp() RETURNING token")


def _bench_worker(kind: str, url: str, name: str, start, results) -> None:
    """Lock cycles (acquire, release) on scope ``name`` for `BENCH_S`; puts (cycles, seconds) on ``results``."""
    if kind == "stockade":
        coord = stockade.connect(url)

        def cycle() -> None:
            coord.acquire(name, ttl_ms=10_000, wait_ms=0, keepalive=False).release()
    else:
        conn = psycopg.connect(url, autocommit=True)

        def cycle() -> None:  # the plain recipe: one upsert that grants when expired, one delete
            token = conn.execute(LEASE_ROW_ACQUIRE, (name, "me")).fetchone()[0]
            conn.execute("DELETE FROM bench_lease WHERE name = %s AND token = %s", (name, token))

    for _ in range(20):
        cycle()
    start.wait()
    cycles, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < BENCH_S:
        cycle()
        cycles += 1
    results.put((cycles, time.perf_counter() - t0))


def _bench(kind: str, url: str, processes: int) -> float:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_bench_worker, args=(kind, url, f"bench-{kind}-{n}", start, results))
               for n in range(processes)]
    for worker in workers:
        worker.start()
    done = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(30)
    return sum(cycles for cycles, _ in done) / max(seconds for _, seconds in done)


@pytest.mark.skipif(os.environ.get("STOCKADE_LONG") != "1", reason="a benchmark: STOCKADE_LONG=1")
def test_lock_cycles_side_by_side_with_a_lease_row(pg_coord_url):
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute(LEASE_ROW_SETUP)
    rows = []
    for processes in (1, 8):
        ours = _bench("stockade", pg_coord_url, processes)
        row = _bench("lease-row", pg_coord_url, processes)
        rows.append((processes, ours, row))
    print("\nprocesses  stockade-on-postgresql  lease-row recipe  ratio")
    for processes, ours, row in rows:
        print(f"{processes:>9}  {ours:>20.0f}/s  {row:>14.0f}/s  {ours / row:.2f}x")


# -- S15: a storm through promotions (STOCKADE_LONG=1) -----------------------------------------

STORM_PROCESSES = 4
STORM_SCOPES = 8
STORM_TTL_MS = 1_000  # tests/helpers/pg_storm.py
PROMOTIONS = 10


def _storm_overlaps(events: list[dict]) -> tuple[int, int]:
    """Grants that overlapped a lease of the same scope in time, as the holders saw them.

    A holder holds from its grant's acknowledgement to the moment it asks for the
    release (``release`` event) or, if it never did, its TTL later. Both ends
    are on the one CLOCK_MONOTONIC of this machine, and each end is on the safe
    side: the grant is acknowledged after the server made it, the release asked
    for before the server forgot it. An overlap is then real: two clients held
    the scope at once (the lease safety the backend gives; fencing catches it).

    Returns:
        (overlaps acknowledged less than a TTL after the earlier acquire was sent,
        so that the server granted the scope again within the earlier lease's TTL;
        overlaps after that: the earlier holder was still at work when its lease
        expired, or the earlier grant was made so late in its wait that nothing
        says the server granted twice).
    """
    ttl_ns = STORM_TTL_MS * 1_000_000
    ends = {(e["release"], e["token"]): e["at"] for e in events if "release" in e}
    within = after = 0
    by_scope: dict[str, list[tuple[int, int, int]]] = {}
    for e in sorted((e for e in events if "grant" in e), key=lambda e: e["at"]):
        end = ends.get((e["grant"], e["token"]), e["at"] + ttl_ns)
        held = by_scope.setdefault(e["grant"], [])
        overlapped = [sent for start, other_end, sent in held if start < end and e["at"] < other_end]
        if overlapped:
            within += any(e["at"] < sent + ttl_ns for sent in overlapped)
            after += all(e["at"] >= sent + ttl_ns for sent in overlapped)
        held.append((e["at"], end, e["sent"]))
    return within, after


def _first_grants_after(events: list[dict], deaths_ns: list[int]) -> list[float]:
    """For each primary's death, the milliseconds until the first grant of the promoted server was acknowledged.

    A grant of the promoted server is one whose token carries a higher timeline
    than every token acknowledged before the death (grants the dead primary made
    may still be acknowledged a little after it died).
    """
    grants = sorted((e["at"], e["token"] >> (22 + 16)) for e in events if "grant" in e)
    waits = []
    for death in deaths_ns:
        before = max((timeline for at, timeline in grants if at <= death), default=0)
        first = next((at for at, timeline in grants if at > death and timeline > before), None)
        if first is not None:
            waits.append((first - death) / 1e6)
    return waits


def _storm_checks(events: list[dict]) -> tuple[int, int, int, int]:
    """(grants, token regressions, duplicate tokens, stale writes accepted), judged in acknowledgement order."""
    grants = sorted((e for e in events if "grant" in e), key=lambda e: e["at"])
    best: dict[str, int] = {}
    regressions = 0
    for e in grants:
        if e["token"] <= best.get(e["grant"], 0):
            regressions += 1
        best[e["grant"]] = max(best.get(e["grant"], 0), e["token"])
    seen = [(e["grant"], e["token"]) for e in grants]
    duplicates = len(seen) - len(set(seen))
    accepted = sorted((e for e in events if e.get("ok")), key=lambda e: e["at"])
    mark: dict[str, int] = {}
    stale = 0
    for e in accepted:
        if e["token"] < mark.get(e["write"], 0):
            stale += 1
        mark[e["write"]] = max(mark.get(e["write"], 0), e["token"])
    return len(grants), regressions, duplicates, stale


def _storm_through_promotions(tmp_path, *, synchronous: bool, timelines: bool, figures: dict | None = None
                              ) -> tuple[int, int, int, int]:
    import json
    import subprocess
    import sys

    from conftest import python_env
    from helpers.pg_cluster import make_synchronous, standby_of

    pair = Pair(synchronous=synchronous)
    ports = (pair.primary.port, pair.standby.port)
    env = {**python_env(), "STOCKADE_TEST_TIMELINES": "1" if timelines else "0"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath("src"), env["PYTHONPATH"]])
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    primary, standby = pair.primary, pair.standby
    events: list[dict] = []
    deaths_ns: list[int] = []
    lock = threading.Lock()
    workers = []
    try:
        argv = [sys.executable, "-c", "import os, runpy, stockade.coordinators.postgres as p; "
                "p.PostgresRecords.timelines = os.environ['STOCKADE_TEST_TIMELINES'] == '1'; "
                "runpy.run_path(os.path.join(os.environ['PYTHONPATH'].split(os.pathsep)[1], 'pg_storm.py'), "
                "run_name='__main__')"]
        for seed in range(STORM_PROCESSES):
            worker = subprocess.Popen([*argv, pair.url, store_url, str(seed), str(STORM_SCOPES)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            workers.append(worker)

            def read(worker=worker) -> None:
                for line in worker.stdout:
                    with lock:
                        events.append(json.loads(line))

            threading.Thread(target=read, daemon=True).start()
        for _ in range(PROMOTIONS):
            def storm_for(grants: int) -> None:
                start = sum(1 for e in events if "grant" in e)
                deadline = time.monotonic() + 60
                while True:
                    with lock:
                        if sum(1 for e in events if "grant" in e) >= start + grants:
                            return
                    assert time.monotonic() < deadline, "the storm made no progress"
                    time.sleep(0.05)

            storm_for(20)  # on this primary, replicated
            if not synchronous:
                standby.stop()  # it falls behind: the next grants reach the primary alone, and are lost
                storm_for(20)
            deaths_ns.append(time.monotonic_ns())
            primary.kill9()
            if not synchronous:
                standby.start()
            promote(standby)
            old_port = primary.port
            primary.close()
            primary = standby
            import stockade.testing.servers.postgres as pg_module

            real_free_port = pg_module._free_port
            pg_module._free_port = lambda port=old_port: port  # the url names two fixed ports
            try:
                standby = standby_of(primary)
            finally:
                pg_module._free_port = real_free_port
            if synchronous:
                make_synchronous(primary)
        assert {primary.port, standby.port} == set(ports)
    finally:
        for worker in workers:
            worker.stdin.close()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        standby.close()
        primary.close()
    with lock:
        if figures is not None:
            figures["overlaps"] = _storm_overlaps(events)
            figures["to_next_grant_ms"] = _first_grants_after(events, deaths_ns)
        return _storm_checks(events)


@pytest.mark.skipif(os.environ.get("STOCKADE_LONG") != "1", reason="10 promotions: STOCKADE_LONG=1")
@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
def test_s15_storm_through_promotions(tmp_path, synchronous):
    import statistics

    figures: dict = {}
    grants, regressions, duplicates, stale = _storm_through_promotions(tmp_path, synchronous=synchronous,
                                                                       timelines=True, figures=figures)
    mode = "sync" if synchronous else "async"
    waits = figures["to_next_grant_ms"]
    print(f"\nS15 {mode}: {PROMOTIONS} promotions, {grants} grants: regressions {regressions}, duplicates "
          f"{duplicates}, stale writes accepted {stale}; grants that overlapped another holder in time: "
          f"{figures['overlaps'][0]} within a TTL of the earlier acquire, {figures['overlaps'][1]} after it; "
          f"primary's death to the next grant: median {statistics.median(waits):.0f} ms "
          f"(min {min(waits):.0f}, max {max(waits):.0f}, {len(waits)} deaths)")
    assert grants >= PROMOTIONS * 20 and regressions == 0 and duplicates == 0 and stale == 0
    assert len(waits) == PROMOTIONS


@pytest.mark.skipif(os.environ.get("STOCKADE_LONG") != "1", reason="10 promotions: STOCKADE_LONG=1")
def test_s15_control_storm_without_timeline_regresses(tmp_path):
    grants, regressions, duplicates, stale = _storm_through_promotions(tmp_path, synchronous=False, timelines=False)
    print(f"\nS15 control (async, no timeline in the token): {grants} grants: regressions {regressions}, "
          f"duplicates {duplicates}, stale writes accepted {stale}")
    assert regressions > 0


# -- a client paused past its TTL -----------------------------------------------------------------

PAUSED_ROUNDS = "50" if os.environ.get("STOCKADE_LONG") == "1" else "12"
PAUSED_CONTROL_ROUNDS = "3"


def test_a_client_paused_past_its_ttl_is_fenced_out(pg_coord_url, tmp_path):
    """The pause case of `stockade check` on this coordinator (`paused_holder_check`): a worker holding a lease
    (TTL 300 ms, keepalive on) is stopped with SIGSTOP, a newer holder is granted once the server expired it and
    writes, the stopped one resumes and writes with its old token: refused in every round."""
    from test_check import paused_holder_check

    out, status = paused_holder_check(pg_coord_url, tmp_path, rounds=PAUSED_ROUNDS)
    assert status == 0 and f"held    pause: 0 of {PAUSED_ROUNDS} stale writes applied" in out, out


def test_control_a_paused_client_writes_where_fencing_is_off(pg_coord_url, tmp_path):
    """The same check with the store's fence turned off (``--control fencing-off``): the old token writes."""
    from test_check import paused_holder_check

    out, status = paused_holder_check(pg_coord_url, tmp_path, "--control", "fencing-off", rounds=PAUSED_CONTROL_ROUNDS)
    assert status == 1, out
    assert f"BROKEN  pause: {PAUSED_CONTROL_ROUNDS} of {PAUSED_CONTROL_ROUNDS} stale writes applied" in out, out


# -- the rules run as SQL (one statement per common case) agree with the lease engine -------------

MODEL_SCOPES = 3
MODEL_OPS_MAX = 12
MODEL_EXAMPLES = 12
SHORT_TTL_MS = 100  # the least ttl; an "expire" step sleeps past it on both sides
_model_examples = iter(range(1_000_000))


def _model_policy():
    from stockade.core.leases import LeasePolicy

    # Nothing but an "expire" step may depend on time: waiters stay alive, lock-delays outlast the run.
    return LeasePolicy(lock_delay_ms=60_000, waiter_stale_ms=60_000)


def _apply(coord, op, ids: list[str], deadlines: dict[str, tuple[str, int]], prefix: str):
    """One step on one coordinator; a plain value describing what it answered."""
    from stockade.core.errors import NotHolder
    from stockade.core.leases import Granted, Queued

    kind, arg, wait = op
    if kind in ("acquire", "expire"):
        lease_id = f"{prefix}-lease-{len(ids)}".ljust(24, "_")
        ids.append(lease_id)
        ttl_ms = SHORT_TTL_MS if kind == "expire" else 60_000
        scope = f"{prefix}-s{arg}"
        attempt = coord.attempt(scope, lease_id=lease_id, holder=f"h{len(ids)}", ttl_ms=ttl_ms, wait_ms=wait)
        deadlines[lease_id] = (scope, attempt.wait_deadline_ns)
        outcome = attempt.outcome
    else:
        lease_id = ids[arg % len(ids)] if ids and arg >= 0 else f"{prefix}-unknown".ljust(24, "_")
        if kind == "again":
            if lease_id not in deadlines:
                return "skipped"
            scope, deadline_ns = deadlines[lease_id]
            outcome = coord.attempt(scope, lease_id=lease_id, holder="again", ttl_ms=60_000, wait_ms=0,
                                    wait_deadline_ns=deadline_ns).outcome
        elif kind == "release":
            return ("released", coord.release(lease_id).released)
        elif kind == "renew":
            try:
                lease = coord.renew(lease_id)
            except NotHolder:
                return ("not holder",)
            return ("renewed", lease.token.value, lease.holder, lease.ttl_ms)
        else:
            coord.cancel_wait(f"{prefix}-s{arg % MODEL_SCOPES}", lease_id)
            return ("cancelled",)
    if isinstance(outcome, Granted):
        return ("granted", outcome.lease.token.value, outcome.lease.holder, outcome.lease.ttl_ms)
    if isinstance(outcome, Queued):
        return ("queued", outcome.position, outcome.holder)
    return ("timed out",)


def _state(coord, prefix: str) -> list[tuple]:
    infos = [coord.inspect(f"{prefix}-s{n}") for n in range(MODEL_SCOPES)]
    journals = [[(e.kind, e.holder, e.token_value) for e in coord.records.history(f"{prefix}-s{n}", 100)]
                for n in range(MODEL_SCOPES)]  # the SQL rules journal what the engine does (docs/history.md)
    return [(i.state, i.holder, i.token.value if i.token else None, i.last_token, i.waiters, journal)
            for i, journal in zip(infos, journals, strict=True)]


def _run_model(sql_side, engine_side, ops) -> list[str]:
    """The same steps on both sides (the SQL rules on, and off); every difference, described."""
    prefix = f"m{next(_model_examples)}"
    differences = []
    sides = [(sql_side, [], {}), (engine_side, [], {})]
    for step, op in enumerate(ops):
        answers = [_apply(coord, op, ids, deadlines, prefix) for coord, ids, deadlines in sides]
        if op[0] == "expire":
            time.sleep(SHORT_TTL_MS * 1.5 / 1000)  # both leases (if granted) have expired now
        states = [_state(coord, prefix) for coord, _, _ in sides]
        if answers[0] != answers[1] or states[0] != states[1]:
            differences.append(f"step {step} {op}: {answers[0]} / {answers[1]}; {states[0]} / {states[1]}")
    return differences


@pytest.fixture
def model_sides(pg_coord_url):
    """A coordinator with the SQL rules and one without, each on its own database of one server (one timeline)."""
    from stockade.coordinators.postgres import PostgresCoordinator

    server = pg_helper.shared_server()
    other = pg_helper.fresh_database(server)
    sql_side = PostgresCoordinator(pg_coord_url, policy=_model_policy())
    engine_side = PostgresCoordinator(server.url(other), policy=_model_policy())
    engine_side.server_rules = False
    yield sql_side, engine_side
    sql_side.close()
    engine_side.close()
    pg_helper.drop_database(server, other)


def _ops():
    from hypothesis import strategies as st

    index = st.integers(-1, MODEL_OPS_MAX)
    return st.lists(st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, MODEL_SCOPES - 1), st.sampled_from([0, 30_000])),
        st.tuples(st.just("expire"), st.integers(0, MODEL_SCOPES - 1), st.just(0)),
        st.tuples(st.sampled_from(["release", "renew", "again", "cancel"]), index, st.just(0)),
    ), min_size=1, max_size=MODEL_OPS_MAX)


def test_sql_rules_agree_with_the_lease_engine(model_sides):
    """A bounded model check: random steps give the same answers and states with the SQL rules as without."""
    from hypothesis import HealthCheck, given, settings

    sql_side, engine_side = model_sides

    @settings(max_examples=MODEL_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_ops())
    def check(ops):
        assert _run_model(sql_side, engine_side, ops) == []

    check()


def test_control_a_barging_sql_rule_is_caught(model_sides):
    """The same check against a grant rule that ignores the queue: it must find the difference."""
    from stockade.coordinators.postgres._rows import SERVER_RULES

    sql_side, engine_side = model_sides
    waiters_check = "OR EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = p_scope)"
    assert waiters_check in SERVER_RULES
    with psycopg.connect(sql_side.records._conninfo, autocommit=True) as conn:
        conn.execute(SERVER_RULES.replace(waiters_check, ""))
    ops = [("acquire", 0, 0), ("acquire", 0, 30_000), ("release", 0, 0), ("acquire", 0, 30_000)]
    differences = _run_model(sql_side, engine_side, ops)
    assert len(differences) == 1 and differences[0].startswith("step 3"), differences


def test_control_a_sql_rule_that_journals_nothing_is_caught(model_sides):
    """The same check against grant and release functions that write no history (the lease's row without the
    time of its grant or of its end, which is how the log shows an event): found at the first step."""
    from stockade.coordinators.postgres._rows import SERVER_RULES

    sql_side, engine_side = model_sides
    silent = SERVER_RULES.replace("v_now / 1000000", "NULL")
    assert SERVER_RULES.count("v_now / 1000000") == 3  # the grant's two forms of its write, the release
    with psycopg.connect(sql_side.records._conninfo, autocommit=True) as conn:
        conn.execute(silent)
    differences = _run_model(sql_side, engine_side, [("acquire", 0, 0), ("release", 0, 0)])
    assert [d.split(":")[0] for d in differences] == ["step 0 ('acquire', 0, 0)", "step 1 ('release', 0, 0)"]
