"""``stockade check`` as a user runs it: a real subprocess against real coordinators and resources (docs/check.md).

Each stack runs one short check (3 rounds per case; ``STOCKADE_LONG=1``: 20)
and must pass; its controls (the same check with the fence turned off, or
``>`` for ``>=``, on the scratch prefix) must fail with the broken case named.
Judged by the exit status and the verdict lines, which count outcomes, never
by times.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import free_port, fresh_pg_url, python_env

import stockade
from stockade.resources.postgres import PostgresFence
from stockade.resources.sqlite_db import SQLiteFence
from stockade.testing.servers.redis import RedisServer, require_redis

ROUNDS = "20" if os.environ.get("STOCKADE_LONG") == "1" else "3"
#: --seconds of the checks that restart a server once a round (20 rounds of a restart take minutes).
RESTART_SECONDS = "900" if os.environ.get("STOCKADE_LONG") == "1" else "120"


def check(*args: str, timeout: float = 240, rounds: str = ROUNDS,
          ttl_ms: str = "300") -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "stockade", "check", "--rounds", rounds, "--ttl-ms", ttl_ms,
                             "--quiet", *args], capture_output=True, text=True, timeout=timeout, env=python_env())
    print(result.stdout, result.stderr)
    return result


def cases(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """``{case: "held" | "BROKEN" | "ERROR"}`` from the verdict lines (ERROR: the case could not run)."""
    found = {}
    for line in result.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("held", "BROKEN", "ERROR") and words[1].endswith(":"):
            found[words[1][:-1]] = words[0]
    return found


def assert_held(result: subprocess.CompletedProcess[str], *, network: bool = False, failover: bool = False,
                restore: bool = False) -> None:
    """Every case held; ``network``: the resource is reached over TCP, so the delay case ran too; ``failover``:
    the coordinator was restarted (an embedded file, or a command); ``restore``: the resource was restored."""
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {"pause": "held", "retries": "held"} | ({"delay": "held"} if network else {}) \
        | ({"failover": "held"} if failover else {}) | ({"restore": "held"} if restore else {})
    assert cases(result) == expected
    assert f"0 of {ROUNDS} stale writes applied" in result.stdout
    assert (f"0 of {ROUNDS} delayed writes applied" in result.stdout) == network
    assert "Traceback" not in result.stderr


def assert_no_workers_left(result: subprocess.CompletedProcess[str]) -> None:
    """Every worker process the check started has ended (ps: none names its scratch id)."""
    scratch = "stockade-check-" + result.stdout.split("scratch prefix stockade-check-")[1].split()[0].rstrip(",")
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert [line for line in listing.splitlines() if scratch in line] == []


def paused_holder_check(coordinator_url: str, tmp_path: Path, *extra: str, ttl_ms: str = "1000",
                        rounds: str = ROUNDS) -> tuple[str, int]:
    """The pause case of `stockade check` (docs/check.md), the one harness for it, on a coordinator a test
    started (etcd, ZooKeeper, PostgreSQL): a worker process holds a scope, is stopped (SIGSTOP) until the
    coordinator ends its lease and another worker has taken and written the scope, then writes with its old
    token to an embedded store; once a round, ``rounds`` rounds. Its output and exit status. The lease is 1 s by
    default: a 300 ms one lapsed before its first renewal once at load (the case could not run, exit 2)."""
    with stockade.connect(coordinator_url) as coord:
        cluster_id = coord.cluster_id
    (tmp_path / "paused").mkdir(parents=True)
    store = f"sqlite:///{tmp_path / 'paused' / 'store.db'}"
    stockade.open_store(store, cluster_id=cluster_id, keys="tokenless").close()
    result = check("--coordinator", coordinator_url, "--resource", store, "--cases", "pause", *extra,
                   "--seconds", "600", timeout=900, ttl_ms=ttl_ms, rounds=rounds)
    return result.stdout, result.returncode


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[str, stockade.Coordinator]]:
    url = f"sqlite:///{tmp_path / 'coord.db'}?process=embedded"  # the file in each process (the default: below)
    with stockade.connect(url) as coord:
        yield url, coord


def test_embedded_coordinator_and_store(tmp_path: Path, embedded) -> None:
    url, coord = embedded
    stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id).close()
    report = tmp_path / "report.html"
    history = tmp_path / "history.jsonl"
    result = check("--coordinator", url, "--resource", f"sqlite:///{tmp_path / 'store.db'}", "--report", str(report),
                   "--history", str(history))
    assert_held(result, failover=True)  # the embedded file: the check reopens it itself
    assert f"0 of {ROUNDS} restarts let a token go back" in result.stdout
    events = [json.loads(line) for line in history.read_text().splitlines()]
    refused = [e for e in events if e["kind"] == "write" and e["outcome"] == "refused"]
    refused = [e for e in refused if e["case"] == "pause"]
    assert len(refused) == int(ROUNDS) and {e["lane"] for e in refused} == {"A"}  # the zombie's, once a round
    assert all(e["mark"] > e["token"] for e in refused)
    page = report.read_text()
    assert "<svg" in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert_no_workers_left(result)
    hexid = result.stdout.split("scratch prefix stockade-check-")[1].split()[0].rstrip(",")
    scopes = [f"stockade-check.{hexid}.{case}" for case in ("keys", "pause", "retries")]
    with stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id) as store:
        assert [store.high_water(scope) > 0 for scope in scopes[1:]] == [True] * 2  # they were written...
        assert [store.list(scope) for scope in scopes] == [[], [], []]  # ...and their keys deleted


def test_the_default_url_is_checked_through_its_host_process_and_restarted(tmp_path: Path) -> None:
    """``--coordinator sqlite:///F`` (the default: F's host process): every case held, and the failover case
    restarted that process once a round (SIGTERM, then the next connect started a new one: its log says
    "listening on" once per start). 1 s leases: a renewal crosses two processes on a loaded host."""
    from stockade.coordinators.sqlite import _host

    url = f"sqlite:///{tmp_path / 'coord.db'}"
    with stockade.connect(url) as coord:
        stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id).close()
    result = check("--coordinator", url, "--resource", f"sqlite:///{tmp_path / 'store.db'}", ttl_ms="1000")
    assert_held(result, failover=True)
    assert f"0 of {ROUNDS} restarts let a token go back" in result.stdout
    starts = (_host.host_dir(tmp_path / "coord.db") / "log").read_text().count("listening on")
    print(f"host process starts: {starts} (1 + {ROUNDS} failover rounds)")
    assert starts == 1 + int(ROUNDS)
    assert_no_workers_left(result)


def test_embedded_store_control_fencing_off_fails(tmp_path: Path, embedded) -> None:
    url, coord = embedded
    stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id).close()
    result = check("--coordinator", url, "--resource", f"sqlite:///{tmp_path / 'store.db'}", "--control", "fencing-off")
    assert result.returncode == 1
    assert cases(result)["pause"] == "BROKEN"
    assert f"{ROUNDS} of {ROUNDS} stale writes applied" in result.stdout
    assert "stockade check: FAILED: pause" in result.stdout


@pytest.fixture
def app_db(tmp_path: Path, embedded) -> Path:
    """A user's SQLite database with a table of its own and the fence installed."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
    conn.commit()
    conn.close()
    SQLiteFence(path, keys=embedded[1].verify_keys()).close()
    return path


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def test_sqlite_database(app_db: Path, embedded) -> None:
    before = _tables(app_db)
    assert_held(check("--coordinator", embedded[0], "--resource", f"sqlite:///{app_db}"), failover=True)
    assert _tables(app_db) == before  # the scratch table was dropped; nothing else was created


@pytest.mark.parametrize("control, broken", [("fencing-off", {"pause", "retries", "failover"}),
                                             ("strict-greater", {"retries"})])
def test_sqlite_database_controls_fail(app_db: Path, embedded, control: str, broken: set[str]) -> None:
    result = check("--coordinator", embedded[0], "--resource", f"sqlite:///{app_db}", "--control", control)
    assert result.returncode == 1
    assert {case for case, verdict in cases(result).items() if verdict == "BROKEN"} == broken


def test_directory(tmp_path: Path, embedded) -> None:
    root = tmp_path / "files"
    root.mkdir()
    report = tmp_path / "report.html"
    result = check("--coordinator", embedded[0], "--resource", f"file://{root}", "--report", str(report))
    assert_held(result, failover=True, restore=True)  # the check restores a copy of its scratch subdirectory
    page = report.read_text()
    for marker in ("coordinator restarted (file reopened)", "resource restored (scratch copy)",
                   "stockade floor: mark raised"):  # drawn as lines across the lanes, and in the event log
        assert page.count(f'class="faulttext">{marker}') == int(ROUNDS), marker
    assert f"0 of {ROUNDS} stale writes applied after the restore and the floor" in result.stdout
    assert f"without the floor {ROUNDS} of {ROUNDS} stale writes were accepted" in result.stdout
    assert list(root.iterdir()) == []  # the scratch subdirectory (and its backup) was removed


def test_directory_control_fails(tmp_path: Path, embedded) -> None:
    root = tmp_path / "files"
    root.mkdir()
    result = check("--coordinator", embedded[0], "--resource", f"file://{root}", "--control", "fencing-off")
    assert result.returncode == 1 and cases(result)["pause"] == "BROKEN"
    assert "FAIL  keyring verifies" in result.stdout  # a forged token got through too


def test_directory_restore_without_the_floor_fails(tmp_path: Path, embedded) -> None:
    """The restore case's control: the same restore, the floor skipped: the zombie's write lands every round."""
    root = tmp_path / "files"
    root.mkdir()
    result = check("--coordinator", embedded[0], "--resource", f"file://{root}", "--control", "restore-no-floor")
    assert result.returncode == 1
    assert {case for case, verdict in cases(result).items() if verdict == "BROKEN"} == {"restore"}
    assert f"{ROUNDS} of {ROUNDS} stale writes applied after the restore" in result.stdout
    assert list(root.iterdir()) == []


def test_serve_and_its_store(serve) -> None:
    server = serve()
    assert_held(check("--coordinator", server.url, "--resource", server.url), network=True)


def _history_verdicts(history: Path) -> dict[str, str]:
    """``{case: verdict}`` from the ``verdict`` lines of a check's ``--history`` as it is now."""
    lines = history.read_text().splitlines() if history.exists() else []
    return {line["case"]: line["verdict"] for line in map(json.loads, lines) if line["kind"] == "verdict"}


def test_a_server_gone_between_cases_keeps_what_was_measured(serve, tmp_path: Path) -> None:
    """`stockade serve` (coordinator and resource) killed by its pid once the history holds the pause case's
    verdict: the pause verdict is printed, kept in the history and the report; retries could not run, and the
    failover case after it is not begun (its workers cannot start: the stack is gone); exit 2. Ordered, not
    timed: the test holds the retries scope's lease from before the pause case ended, so retries cannot pass its
    first grant before the kill. (Before: exit 1 or 2, no verdict in the history until the end.)"""
    server = serve()
    history, report = tmp_path / "history.jsonl", tmp_path / "report.html"
    argv = [sys.executable, "-m", "stockade", "check", "--coordinator", server.url, "--resource", server.url,
            "--cases", "pause,retries,failover", "--coordinator-restart", "true", "--rounds", ROUNDS,
            "--ttl-ms", "300", "--seconds", "600", "--quiet",
            "--history", str(history), "--report", str(report)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**python_env(), "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        hexid = first.split("scratch prefix stockade-check-")[1].split()[0].rstrip(",")
        with stockade.connect(server.url) as coord:
            coord.acquire(f"stockade-check.{hexid}.retries", ttl_ms=120_000, wait_ms=10_000, holder="test")
            assert "pause" not in _history_verdicts(history)  # taken before the pause case ended
            while "pause" not in _history_verdicts(history) and process.poll() is None:
                time.sleep(0.02)
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    result = subprocess.CompletedProcess(argv, process.returncode, first + out, err)
    print(result.stdout, result.stderr)
    assert _history_verdicts(history) == {"pause": "held", "retries": "could not run", "failover": "could not run"}
    assert result.returncode == 2, result.stdout + result.stderr
    assert cases(result) == {"pause": "held", "retries": "ERROR", "failover": "ERROR"}
    assert f"held    pause: 0 of {ROUNDS} stale writes applied" in result.stdout
    assert "ERROR   retries: could not run: " in result.stdout  # a worker's or the check's own request refused
    assert "ERROR   failover: could not run: the workers did not start: worker A exited" in result.stdout
    assert "INCOMPLETE: 1 of 3 cases held, none broke; could not run: retries, failover, clean-up" in result.stdout
    assert "note: the clean-up could not finish, scratch data may be left: " in result.stdout
    assert result.stderr.strip().startswith("stockade check: retries: could not run: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    events = [json.loads(line) for line in history.read_text().splitlines()]
    refused = [e for e in events if e["kind"] == "write" and e["case"] == "pause" and e["outcome"] == "refused"]
    assert len(refused) == int(ROUNDS)  # every pause round's zombie write, kept
    page = report.read_text()
    assert '<td class="held">held</td>' in page and '<td class="could-not-run">could not run</td>' in page
    assert_no_workers_left(result)


def test_a_restart_that_leaves_the_server_down_keeps_what_was_measured(serve, tmp_path: Path) -> None:
    """The check's own connection is the first to fail: the failover case's "restart" command ends the
    `stockade serve` by its pid and starts nothing, so the check's reconnect gives up (after its 30 s). The pause
    verdict, run before, is printed and kept; failover could not run; exit 2. (Before: exit 2 with the one line
    of the error, no verdict printed, no history, no report.)"""
    server = serve()
    history, report = tmp_path / "history.jsonl", tmp_path / "report.html"
    result = check("--coordinator", server.url, "--resource", server.url, "--cases", "pause,failover",
                   "--coordinator-restart", f"kill -9 {server.process.pid}", "--seconds", "600",
                   "--history", str(history), "--report", str(report))
    assert result.returncode == 2, result.stdout + result.stderr
    assert cases(result) == {"pause": "held", "failover": "ERROR"}
    assert f"held    pause: 0 of {ROUNDS} stale writes applied" in result.stdout
    assert "ERROR   failover: could not run: cannot connect to " in result.stdout  # the check's own reconnect
    assert result.stderr.startswith("stockade check: failover: could not run: ")
    assert _history_verdicts(history) == {"pause": "held", "failover": "could not run"}
    assert '<td class="could-not-run">could not run</td>' in report.read_text()
    assert_no_workers_left(result)


@pytest.fixture
def pg_fenced() -> Iterator[tuple[str, str]]:
    """A PostgreSQL coordinator database and a user's database with the fence installed for it."""
    with fresh_pg_url() as coord_url, fresh_pg_url() as app_url:
        with stockade.connect(coord_url) as coord:
            PostgresFence(app_url, keys=coord.verify_keys()).install()
        yield coord_url, app_url


def test_postgres_coordinator_and_postgres_fence(pg_fenced) -> None:
    coord_url, app_url = pg_fenced
    result = check("--coordinator", coord_url, "--resource", app_url)
    assert_held(result, network=True)
    assert "ok    fence schema installed" in result.stdout
    with psycopg.connect(app_url) as conn:
        left = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'stockade_check_%'").fetchone()
    assert left == (0,)


def test_postgres_table_written_without_the_fence_fails(pg_fenced) -> None:
    coord_url, app_url = pg_fenced
    result = check("--coordinator", coord_url, "--resource", app_url, "--control", "fencing-off")
    assert_no_workers_left(result)  # A was frozen in every round, and in the proxy's hold: all ended
    assert result.returncode == 1
    assert cases(result) == {"pause": "BROKEN", "delay": "BROKEN", "retries": "BROKEN"}
    assert f"{ROUNDS} of {ROUNDS} delayed writes applied" in result.stdout


def test_postgres_repeatable_read_is_said_before_the_cases(pg_fenced) -> None:
    coord_url, app_url = pg_fenced
    with psycopg.connect(app_url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_isolation = \'repeatable read\'')
    result = check("--coordinator", coord_url, "--resource", app_url, rounds="1")
    assert "warn  default isolation level: repeatable read" in result.stdout
    assert result.returncode == 0  # the fence holds under it (docs/fence-postgres.md); the line says what to expect


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def test_redis(redis_server: RedisServer, embedded) -> None:
    result = check("--coordinator", embedded[0], "--resource", redis_server.url)
    assert_held(result, network=True, failover=True)
    assert "ok    maxmemory-policy (eviction): noeviction" in result.stdout
    import redis

    client = redis.Redis.from_url(redis_server.url)
    assert [key for key in client.scan_iter("{stockade-check.*}:*")] == []  # the scratch keys were deleted
    client.close()


def test_redis_control_and_evicting_policy_fail(redis_server: RedisServer, embedded) -> None:
    result = check("--coordinator", embedded[0], "--resource", redis_server.url, "--control", "fencing-off")
    assert result.returncode == 1 and cases(result)["pause"] == cases(result)["delay"] == "BROKEN"
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.close()
    result = check("--coordinator", embedded[0], "--resource", redis_server.url, rounds="1")
    assert result.returncode == 1
    assert "FAIL  maxmemory-policy (eviction): allkeys-lru" in result.stdout


@pytest.mark.parametrize("resource, message", [
    ("sqlte:///nowhere.db", "unknown scheme 'sqlte'"),
    ("sqlite:///no/such/file.db", "no such SQLite file"),
    ("nonsense", "is not a url"),
    ("postgresql://127.0.0.1:1/db", ""),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, embedded, resource: str, message: str) -> None:
    result = check("--coordinator", embedded[0], "--resource", resource, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("stockade check: ") and message in result.stderr


def test_unreachable_coordinator_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    result = check("--coordinator", "http://127.0.0.1:1", "--resource", f"file://{root}", timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(root.iterdir()) == []  # nothing touched


def test_etcd_coordinator_and_redis(etcd_cluster, redis_server: RedisServer, tmp_path: Path) -> None:
    """etcd leases count whole seconds (at least 2 s: docs/coordinator-etcd.md), so a pause round lasts ~2 s."""
    assert_held(check("--coordinator", f"{etcd_cluster.url}/{tmp_path.name}", "--resource", redis_server.url,
                      "--seconds", "600", timeout=900), network=True)


def test_zookeeper_coordinator_and_directory(zk_ensemble, tmp_path: Path) -> None:
    """A frozen holder's scope is freed when its session expires: a 2 s session (docs/coordinator-zookeeper.md)."""
    root = tmp_path / "files"
    root.mkdir()
    assert_held(check("--coordinator", f"{zk_ensemble.url}/{tmp_path.name}?session_timeout_ms=2000",
                      "--resource", f"file://{root}", "--seconds", "600", timeout=900,
                      ttl_ms="1000"), restore=True)  # 300 ms: a renewal refused once at load 10-16
    assert list(root.iterdir()) == []


# -- coordinator failover by the user's command ------------------------------------------------------------------


@pytest.fixture
def pg_coordinator(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A PostgreSQL cluster of its own (it is restarted), its url, and its server; stopped by pg_ctl after."""
    from stockade.testing.servers import postgres as pg_helper

    if not pg_helper.available():
        pytest.skip("PostgreSQL 15 is not installed")
    server = pg_helper.PostgresServer()
    try:
        url = server.url()
        stockade.connect(url).close()  # the coordinator's tables
        yield url, server
    finally:
        server.stop()
        subprocess.run([*pg_helper._as_postgres(), str(pg_helper.BIN / "pg_ctl"), "stop", "-D", str(server.datadir),
                        "-m", "immediate", "-w"], capture_output=True, timeout=60, cwd="/")
        shutil.rmtree(server.root, ignore_errors=True)


def _as_postgres(command: str) -> str:
    from stockade.testing.servers import postgres as pg_helper

    return " ".join([*pg_helper._as_postgres(), "sh", "-c", shlex.quote(command)])


def test_failover_postgres_coordinator_restarted_by_pg_ctl(pg_coordinator, tmp_path: Path) -> None:
    from stockade.testing.servers import postgres as pg_helper

    url, server = pg_coordinator
    root = tmp_path / "files"
    root.mkdir()
    restart = _as_postgres(f"{pg_helper.BIN}/pg_ctl restart -D {server.datadir} -m fast -w "
                           f"-l {server.root}/restart.log")
    result = check("--coordinator", url, "--resource", f"file://{root}", "--coordinator-restart", restart,
                   "--seconds", RESTART_SECONDS)
    assert_held(result, failover=True, restore=True)
    assert f"0 of {ROUNDS} restarts let a token go back (C1); 0 of {ROUNDS} rounds where the holder from before won" \
        in result.stdout
    assert_no_workers_left(result)


def test_failover_postgres_restored_from_an_old_copy_fails(pg_coordinator, tmp_path: Path) -> None:
    """The control: the "restart" brings back a copy of the data directory taken before the check, on the same
    timeline, so the scope's counter starts again: every round a token goes back."""
    from stockade.testing.servers import postgres as pg_helper

    url, server = pg_coordinator
    ctl, data, old = f"{pg_helper.BIN}/pg_ctl", server.datadir, server.root / "old"
    server.stop()
    subprocess.run(_as_postgres(f"cp -a {data} {old}"), shell=True, check=True, timeout=60)
    server.start()
    root = tmp_path / "files"
    root.mkdir()
    swap = _as_postgres(f"{ctl} stop -D {data} -m fast -w && rm -rf {data} && cp -a {old} {data} && "
                        f"{ctl} restart -D {data} -w -l {server.root}/restart.log")
    result = check("--coordinator", url, "--resource", f"file://{root}", "--coordinator-restart", swap,
                   "--seconds", RESTART_SECONDS)
    assert result.returncode == 1
    assert cases(result)["failover"] == "BROKEN"
    assert f"{ROUNDS} of {ROUNDS} restarts let a token go back" in result.stdout


@pytest.fixture
def restartable_serve(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A `stockade serve` started by tests/helpers/serve_restart.py: its url and the helper's command line."""
    home, port = tmp_path / "serve", free_port()
    helper = f"{shlex.quote(sys.executable)} {Path(__file__).parent / 'helpers' / 'serve_restart.py'}"
    subprocess.run(f"{helper} start {home} {port}", shell=True, check=True, timeout=60, env=python_env())
    try:
        yield f"http://127.0.0.1:{port}", f"{helper} restart {home} {port}"
    finally:
        subprocess.run(f"{helper} stop {home}", shell=True, timeout=60)


def test_failover_serve_restarted_by_a_script(restartable_serve) -> None:
    url, restart = restartable_serve
    result = check("--coordinator", url, "--resource", url, "--coordinator-restart", restart,
                   "--seconds", RESTART_SECONDS)
    assert_held(result, network=True, failover=True)


def test_failover_serve_back_on_a_fresh_data_dir_fails(restartable_serve) -> None:
    url, restart = restartable_serve
    result = check("--coordinator", url, "--resource", url, "--coordinator-restart", restart + " --fresh",
                   "--seconds", RESTART_SECONDS, rounds="1")
    assert result.returncode == 1
    assert cases(result)["failover"] == "BROKEN"
    assert "1 of 1 came back as another cluster" in result.stdout  # its values stay above (a new epoch): R2 fails


@pytest.mark.parametrize("option, command, message, case", [
    ("--coordinator-restart", "echo no such service >&2; exit 3", "exited 3: no such service", "failover"),
    ("--resource-restore", "sleep 30", "did not end within", "restore"),
    ("--coordinator-restart", " ", "is an empty command", None),
])
def test_a_command_that_fails_is_one_line_and_exit_2(tmp_path: Path, embedded, option: str, command: str,
                                                      message: str, case: str | None) -> None:
    """A command that fails mid-run: its case could not run, the others' verdicts stand (the restore case after
    a failed restart runs on the coordinator the command left); an empty one is refused before anything."""
    root = tmp_path / "files"
    root.mkdir()
    result = check("--coordinator", embedded[0], "--resource", f"file://{root}", option, command, "--seconds", "4",
                   rounds="1", timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    where = f"{case}: could not run: " if case else ""
    assert result.stderr.startswith(f"stockade check: {where}{option}: ") and message in result.stderr
    if case:
        others = {"pause", "retries", "failover", "restore"} - {case}
        assert cases(result) == {name: "held" for name in others} | {case: "ERROR"}
    assert list(root.iterdir()) == []  # the scratch subdirectory removed all the same
    if "scratch prefix" in result.stdout:  # the empty command is refused before anything starts
        assert_no_workers_left(result)
