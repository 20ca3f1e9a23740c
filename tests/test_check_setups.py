"""``stockade check`` on the setups an attack review broke, as a user, and by a user's restore command.

Each setup must be said by a setup line before any case runs (``warn`` or
``FAIL``), or make a case fail: never a silent pass (docs/check.md, The setup
lines). A REPEATABLE READ workload and an evicting Redis are in
tests/test_check.py; here a ``SQL_ASCII`` database, a keyring backup beside
the store, a partitioned protected table, the check run by a user that is not
root, unreachable resources, and a PostgreSQL restored by ``pg_restore``.
One round per case: the lines are what is judged (the long figures are
tests/test_check.py's, ``STOCKADE_LONG=1``).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import fresh_pg_url
from test_check import assert_no_workers_left, cases, check

import stockade
from stockade.resources.postgres import PostgresFence, install_ddl_guard, protect
from stockade.resources.postgres._protect import _control_protect_named_table_only

SRC = Path(__file__).resolve().parent.parent / "src"


def setup_line(result: subprocess.CompletedProcess[str], name: str) -> str:
    """The setup line named ``name`` (``verdict  name: found``), which must come before the cases."""
    head = result.stdout.split("\ncases:")[0]
    found = [line.strip() for line in head.splitlines() if line.strip().split("  ", 1)[-1].strip().startswith(name)]
    assert len(found) == 1, result.stdout
    return found[0]


@pytest.fixture
def pg_fenced_sql_ascii() -> Iterator[tuple[str, str]]:
    with fresh_pg_url() as coord_url, fresh_pg_url("SQL_ASCII") as app_url:
        with stockade.connect(coord_url) as coord:
            PostgresFence(app_url, keys=coord.verify_keys()).install()
        yield coord_url, app_url


def test_postgres_sql_ascii_database_is_said_and_holds(pg_fenced_sql_ascii) -> None:
    """SQL_ASCII (what initdb makes under a C locale): the line names it; the fence holds there
    (docs/fence-postgres.md, Database encoding), so every case held is the right verdict, not a silent one."""
    coord_url, app_url = pg_fenced_sql_ascii
    result = check("--coordinator", coord_url, "--resource", app_url, rounds="1", ttl_ms="1000")  # every case
    assert setup_line(result, "database encoding") == \
        "ok    database encoding: SQL_ASCII (the cases' client_encoding: SQL_ASCII)"  # text comes back as bytes
    assert result.returncode == 0 and set(cases(result).values()) == {"held"}, result.stdout


@pytest.fixture
def pg_app() -> Iterator[tuple[str, str]]:
    """A coordinator and a user's database with the fence installed and a partitioned table ``orders``."""
    with fresh_pg_url() as coord_url, fresh_pg_url() as app_url:
        with stockade.connect(coord_url) as coord:
            PostgresFence(app_url, keys=coord.verify_keys()).install()
        with psycopg.connect(app_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id int, region text) PARTITION BY LIST (region)")
            conn.execute("CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')")
        yield coord_url, app_url


PROTECTED = "protected tables"


def test_postgres_partitioned_table_covered_is_ok(pg_app) -> None:
    coord_url, app_url = pg_app
    with psycopg.connect(app_url, autocommit=True) as conn:
        install_ddl_guard(conn)
        protect(conn, "orders", scope="orders")
        conn.execute("CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')")  # covered by the guard
    # One case with 1 s leases: what is checked is the setup (exit 0: no FAIL line); at a load of 20 a
    # worker's 300 ms lease lapsed once, so a case could not run (exit 2, INCOMPLETE).
    result = check("--coordinator", coord_url, "--resource", app_url, "--cases", "pause", rounds="1", ttl_ms="1000")
    line = setup_line(result, PROTECTED)
    assert line.startswith("ok") and "orders (scope orders, 3 tables); DDL guard installed" in line, line
    assert result.returncode == 0, result.stdout


def test_postgres_partition_added_without_the_guard_is_a_fail_line(pg_app) -> None:
    """A partition created after protect, with no DDL guard, takes writes with no token: FAIL, named."""
    coord_url, app_url = pg_app
    with psycopg.connect(app_url, autocommit=True) as conn:
        protect(conn, "orders", scope="orders", added_later="unprotected")
        conn.execute("CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')")
    result = check("--coordinator", coord_url, "--resource", app_url, rounds="1")
    line = setup_line(result, PROTECTED)
    assert line.startswith("FAIL") and "NOT COVERED: orders_us (in the tree of orders)" in line, line
    assert result.returncode == 1 and "FAILED: setup: protected tables" in result.stdout


def test_postgres_control_protect_on_the_named_table_only_is_a_fail_line(pg_app) -> None:
    """The control: the old protect (the trigger on the parent only): the partition is named uncovered."""
    coord_url, app_url = pg_app
    with psycopg.connect(app_url, autocommit=True) as conn:
        _control_protect_named_table_only(conn, "orders", scope="orders")
    line = setup_line(check("--coordinator", coord_url, "--resource", app_url, rounds="1"), PROTECTED)
    assert line.startswith("FAIL") and "NOT COVERED: orders_eu" in line, line


def _store_beside_coordinator(directory: Path) -> str:
    url = f"sqlite:///{directory / 'coord.db'}?process=embedded"
    with stockade.connect(url) as coord:
        stockade.open_store(f"sqlite:///{directory / 'store.db'}", cluster_id=coord.cluster_id).close()
    return url


def test_keyring_backup_beside_the_store_is_said(tmp_path: Path) -> None:
    """A copy of the keyring beside the store (docs/tokens.md: discovery refuses several, L2): a warn line that
    names both; a copy readable by others: FAIL (whoever reads it mints tokens)."""
    url = _store_beside_coordinator(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    alone = setup_line(check("--coordinator", url, "--resource", store, rounds="1"), "keyrings beside the data")
    assert alone == "ok    keyrings beside the data: coord.keys"
    shutil.copy(tmp_path / "coord.keys", tmp_path / "coord.backup.keys")  # cp keeps the mode: 0600
    result = check("--coordinator", url, "--resource", store, rounds="1")
    line = setup_line(result, "keyrings beside the data")
    assert line.startswith("warn") and "coord.backup.keys, coord.keys" in line
    assert "a store opened without keys= refuses to open (L2)" in line
    (tmp_path / "coord.backup.keys").chmod(0o644)
    result = check("--coordinator", url, "--resource", store, rounds="1")
    assert setup_line(result, "keyrings beside the data").startswith(
        "FAIL  keyrings beside the data: coord.backup.keys (mode 0644) readable by others")
    assert result.returncode == 1


def test_keyring_copy_beside_a_directory_is_said(tmp_path: Path) -> None:
    url = _store_beside_coordinator(tmp_path)
    root = tmp_path / "files"
    root.mkdir()
    shutil.copy(tmp_path / "coord.keys", root / "coord.keys.bak")  # not read by discovery, a secret all the same
    line = setup_line(check("--coordinator", url, "--resource", f"file://{root}", rounds="1"),
                      "keyrings beside the data")
    assert line.startswith("ok    keyrings beside the data: coord.keys.bak")  # one copy, 0600: the resource's keys
    (root / "coord.keys.bak").chmod(0o640)
    line = setup_line(check("--coordinator", url, "--resource", f"file://{root}", rounds="1"),
                      "keyrings beside the data")
    assert line.startswith("FAIL") and "coord.keys.bak (mode 0640)" in line


# -- run by a user that is not root -------------------------------------------------------------------------------


def _user() -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("nobody")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@pytest.fixture
def user_home() -> Iterator[Path]:
    """A directory the user (``nobody`` when the tests run as root) owns, with its own copy of the sources (a
    checkout or a virtualenv under a private home is not readable by it), like tests/test_package.py's sandbox."""
    base = Path(tempfile.mkdtemp(prefix="stockade-check-user-"))
    try:
        shutil.copytree(SRC / "stockade", base / "src" / "stockade", ignore=shutil.ignore_patterns("__pycache__"))
        (base / "work").mkdir()
        ids = _user()
        if ids:
            for path in [base, *base.rglob("*")]:
                os.chown(path, ids["user"], ids["group"])  # type: ignore[arg-type]
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as_user(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable  # the venv's is under root's home
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base / "work"), "LANG": "C.UTF-8",
           "PYTHONPATH": str(base / "src"), "XDG_STATE_HOME": str(base / "work")}
    result = subprocess.run([python, *args], cwd=base / "work", env=env, capture_output=True, text=True,
                            timeout=240, stdin=subprocess.DEVNULL, **_user())  # type: ignore[call-overload]
    print(result.stdout, result.stderr)
    return result


def test_runs_as_a_user_that_is_not_root(user_home: Path) -> None:
    """As ``nobody``: every case held, its workers (its own processes, frozen and resumed) ended (ps), nothing
    left under the scratch prefix; a bad url is one line and exit 2 for it too."""
    work = user_home / "work"
    made = _as_user(user_home, "-c", f"import stockade; c = stockade.connect('sqlite:///{work}/coord.db'); "
                                     f"stockade.open_store('sqlite:///{work}/store.db', cluster_id=c.cluster_id)")
    assert made.returncode == 0
    (work / "files").mkdir()
    if os.geteuid() == 0:
        os.chown(work / "files", *[_user()[k] for k in ("user", "group")])  # type: ignore[misc]
    # The default url: the file's host process runs as the user too; 1 s leases (a renewal crosses two processes).
    result = _as_user(user_home, "-m", "stockade", "check", "--coordinator", f"sqlite:///{work}/coord.db",
                      "--resource", f"file://{work}/files", "--rounds", "1", "--ttl-ms", "1000", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    assert cases(result) == {"pause": "held", "retries": "held", "failover": "held", "restore": "held"}
    assert_no_workers_left(result)
    assert list((work / "files").iterdir()) == []
    bad = _as_user(user_home, "-m", "stockade", "check", "--coordinator", f"sqlite:///{work}/coord.db",
                   "--resource", "redis://127.0.0.1:1/0")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stdout == "" and "Traceback" not in bad.stderr
    if os.geteuid() == 0:
        owners = {path.stat().st_uid for path in work.rglob("*")}
        assert owners == {_user()["user"]}  # everything it made is the user's: it ran as the user


@pytest.mark.parametrize("resource", ["redis://127.0.0.1:1/0", "http://127.0.0.1:1"])
def test_unreachable_resource_is_one_line_and_exit_2(tmp_path: Path, resource: str) -> None:
    url = _store_beside_coordinator(tmp_path)
    with stockade.connect(url) as coord:
        before = coord.scopes()
    result = check("--coordinator", url, "--resource", resource, timeout=60)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("stockade check: ")
    with stockade.connect(url) as coord:
        assert coord.scopes() == before  # nothing touched: not even the keyring line's lease


def test_cases_runs_only_those_and_refuses_a_name_that_is_none(tmp_path: Path) -> None:
    url = _store_beside_coordinator(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    result = check("--coordinator", url, "--resource", store, "--cases", "pause", rounds="1")
    assert result.returncode == 0 and cases(result) == {"pause": "held"}
    bad = check("--coordinator", url, "--resource", store, "--cases", "pause,pauses", timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.strip() == \
        "stockade check: --cases: pauses: the cases are pause, delay, retries, failover, restore"


def test_serve_whose_store_accepts_every_token_fails(tmp_path: Path) -> None:
    """The control of the `stockade serve` stack: the check cannot turn a server's fence off from outside, so
    the server itself is the control (``fencing-off`` in tests/helpers/server_controls.py): the zombie's write
    and the delayed one land in every round."""
    import time
    import urllib.request

    from conftest import HELPERS, free_port, python_env

    from stockade.testing.servers import reaper

    port = free_port()
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen([sys.executable, str(HELPERS / "server_controls.py"), "fencing-off", "--data-dir",
                                   str(tmp_path / "data"), "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=python_env())
    reaper.watch(server.pid)
    try:
        for _ in range(600):  # until /healthz answers (or the server died)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        result = check("--coordinator", url, "--resource", url, "--cases", "pause,delay", rounds="2")
        assert result.returncode == 1 and cases(result) == {"pause": "BROKEN", "delay": "BROKEN"}, result.stdout
        assert "2 of 2 stale writes applied" in result.stdout and "2 of 2 delayed writes applied" in result.stdout
    finally:
        server.terminate()
        server.wait(30)


# -- a PostgreSQL restored by the user's command ------------------------------------------------------------------


def test_postgres_restored_by_pg_restore(pg_fenced_sql_ascii, tmp_path: Path) -> None:
    """``--resource-restore``: the database dropped and restored from a ``pg_dump`` taken after install (its
    marks from before the check): the stale holder is accepted without the floor, refused after it."""
    from stockade.testing.servers import postgres as pg_helper

    coord_url, app_url = pg_fenced_sql_ascii
    server = pg_helper.shared_server()
    name = app_url.rsplit("/", 1)[1]
    dump = server.root / f"{name}.dump"
    conn = f"-h 127.0.0.1 -p {server.port} -U {pg_helper.SUPERUSER}"

    def as_pg(command: str) -> str:
        return " ".join([*pg_helper._as_postgres(), "sh", "-c", shlex.quote(command)])

    subprocess.run(as_pg(f"{pg_helper.BIN}/pg_dump {conn} -Fc -f {dump} {name}"), shell=True, check=True, timeout=60)
    restore = as_pg(f"{pg_helper.BIN}/dropdb {conn} --force {name} && {pg_helper.BIN}/createdb {conn} -E SQL_ASCII "
                    f"-T template0 --locale C {name} && {pg_helper.BIN}/pg_restore {conn} -d {name} {dump}")
    try:
        result = check("--coordinator", coord_url, "--resource", app_url, "--resource-restore", restore,
                       rounds="2")
        assert result.returncode == 0 and cases(result)["restore"] == "held", result.stdout
        assert "0 of 2 stale writes applied after the restore and the floor; 0 of 2 current holders refused; " \
               "without the floor 2 of 2 stale writes were accepted" in result.stdout
        assert_no_workers_left(result)
        control = check("--coordinator", coord_url, "--resource", app_url, "--resource-restore", restore,
                        "--control", "restore-no-floor", rounds="2")
        assert control.returncode == 1 and cases(control)["restore"] == "BROKEN"
        assert "2 of 2 stale writes applied after the restore" in control.stdout
        with psycopg.connect(app_url) as db:
            assert db.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'stockade_check_%'").fetchone() \
                == (0,)
    finally:
        dump.unlink(missing_ok=True)
