"""``stockade floor``: after a restore, old tokens are stale again; bad input changes nothing.

The resource here is stockade's own SQLite store restored by copying an older
file over it (the careless restore that `restore()` exists to avoid). The
adapters over users' own data run the same command in their own tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env

import stockade
from stockade.resources.floor import open_floor_target, raise_to_floors, redact_url

STOCKADE = [sys.executable, "-m", "stockade"]
OLD_TOKENS = 20


def floor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STOCKADE, "floor", *args], capture_output=True, text=True, env=python_env(), timeout=60)


@pytest.fixture
def restored(tmp_path: Path) -> tuple[Path, list[str]]:
    """A data dir whose store was restored from a copy taken after the first of `OLD_TOKENS` + 1 leases."""
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}")
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    tokens = []
    for i in range(OLD_TOKENS + 1):
        with coord.lock("jobs", ttl_ms=5_000) as lease:
            store.put("jobs", "k", f"v{i}".encode(), token=lease.token)
            tokens.append(lease.token.encode())
        if i == 0:
            store.close()
            shutil.copy(tmp_path / "store.db", tmp_path / "backup.db")
            store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    store.close()
    coord.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"store.db{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", tmp_path / "store.db")
    return tmp_path, tokens[1:-1]  # every token newer than the backup but older than the last lease


def _old_tokens_accepted(data: Path, tokens: list[str]) -> int:
    coord = stockade.connect(f"sqlite:///{data / 'coord.db'}")
    store = stockade.open_store(f"sqlite:///{data / 'store.db'}", cluster_id=coord.cluster_id)
    accepted = 0
    try:
        for token in tokens:
            try:
                store.put("jobs", "k", b"zombie", token=token)
                accepted += 1
            except stockade.StaleToken:
                pass
    finally:
        store.close()
        coord.close()
    return accepted


def test_control_without_the_floor_old_tokens_write_into_a_restored_store(restored: tuple[Path, list[str]]) -> None:
    data, tokens = restored
    assert _old_tokens_accepted(data, tokens) == len(tokens)  # every one of them: the hole the floor closes


def test_after_stockade_floor_no_old_token_is_accepted(restored: tuple[Path, list[str]]) -> None:
    data, tokens = restored
    done = floor(f"sqlite:///{data / 'store.db'}", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    first = stockade.FencingToken.decode(tokens[0]).value - 1  # the backup's mark: the first lease's token
    assert f"jobs: {first} -> " in done.stdout and "raised 1 of 1 scopes" in done.stdout
    assert _old_tokens_accepted(data, tokens) == 0  # 0 of OLD_TOKENS - 1
    again = floor(f"sqlite:///{data / 'store.db'}", "--data-dir", str(data), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["raised"] == []  # a second run changes nothing


def test_dry_run_changes_nothing(restored: tuple[Path, list[str]]) -> None:
    data, tokens = restored
    before = (data / "store.db").read_bytes()
    done = floor(f"sqlite:///{data / 'store.db'}", "--data-dir", str(data), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dry_run"] and [c["scope"] for c in report["raised"]] == ["jobs"]
    assert (data / "store.db").read_bytes() == before


def test_the_floor_of_the_api_matches_the_command(restored: tuple[Path, list[str]]) -> None:
    data, tokens = restored
    coord = stockade.connect(f"sqlite:///{data / 'coord.db'}")
    target = open_floor_target(f"sqlite:///{data / 'store.db'}", cluster_id=coord.cluster_id)
    try:
        report = raise_to_floors(target, coord.fence_floors())
        first = stockade.FencingToken.decode(tokens[0]).value - 1
        assert [(c.scope, c.before) for c in report.raised] == [("jobs", first)]
        assert report.raised[0].after == coord.last_issued("jobs")
    finally:
        target.close()
        coord.close()
    assert _old_tokens_accepted(data, tokens) == 0


@pytest.mark.parametrize(
    "resource, message",
    [
        ("sqlite:///nowhere/store.db", "no SQLite file"),
        ("nosuch://x", "unknown resource scheme"),
        ("store.db", "must be a url"),
    ],
    ids=["missing-file", "unknown-scheme", "not-a-url"],
)
def test_bad_resources_are_clear_errors_and_create_nothing(
    restored: tuple[Path, list[str]], resource: str, message: str
) -> None:
    data, _ = restored
    done = floor(resource, "--data-dir", str(data))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not Path("/nowhere").exists()


def test_a_store_of_another_cluster_is_refused(restored: tuple[Path, list[str]], tmp_path: Path) -> None:
    data, _ = restored
    other = tmp_path / "other"
    other.mkdir()
    coord = stockade.connect(f"sqlite:///{other / 'coord.db'}")
    coord.close()
    before = (data / "store.db").read_bytes()
    done = floor(f"sqlite:///{data / 'store.db'}", "--url", f"sqlite:///{other / 'coord.db'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (data / "store.db").read_bytes() == before


def test_a_missing_coordinator_is_refused_not_created(tmp_path: Path) -> None:
    done = floor("sqlite:///x.db", "--url", f"sqlite:///{tmp_path / 'typo.db'}")
    assert done.returncode == 1 and "no coordinator" in done.stderr
    assert not (tmp_path / "typo.db").exists()


def test_passwords_are_not_printed() -> None:
    assert redact_url("postgresql://app:s3cret@db1:5432/app") == "postgresql://app:***@db1:5432/app"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_stockade_floor_on_a_users_postgresql(tmp_path: Path) -> None:
    """A user's PostgreSQL whose marks went back (a restore): old tokens write until ``stockade floor`` runs."""
    import psycopg

    from stockade.resources.postgres import fenced, install
    from stockade.testing.servers.postgres import drop_database, fresh_database, shared_server

    server = shared_server()
    name = fresh_database(server)
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}")
    try:
        with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
            install(conn, keys=coord.verify_keys())
            conn.execute("CREATE TABLE jobs (id int PRIMARY KEY, v text)")
            tokens = []
            for i in range(OLD_TOKENS + 1):
                with coord.lock("jobs", ttl_ms=5_000) as lease, fenced(conn, lease.token):
                    conn.execute("INSERT INTO jobs VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                                 (str(i),))
                    tokens.append(lease.token.encode())
            # What a restore of an older backup does to the mark: it goes back to the first lease's token.
            first = stockade.FencingToken.decode(tokens[0]).value
            conn.execute("UPDATE stockade.high_water SET high_water = %s WHERE scope = 'jobs'", (first,))

            def old_accepted() -> int:
                accepted = 0
                for token in tokens[1:-1]:
                    try:
                        with fenced(conn, token):
                            conn.execute("UPDATE jobs SET v = 'zombie' WHERE id = 1")
                        accepted += 1
                    except stockade.StaleToken:
                        pass
                return accepted

            assert old_accepted() == OLD_TOKENS - 1  # the control: the hole the floor closes
            done = floor(server.url(name), "--url", f"sqlite:///{tmp_path / 'coord.db'}")
            assert done.returncode == 0, done.stderr
            assert "raised 1 of 1 scopes" in done.stdout
            assert old_accepted() == 0  # 0 of OLD_TOKENS - 1
    finally:
        coord.close()
        drop_database(server, name)


def test_stockade_floor_refuses_a_postgresql_without_the_fence(tmp_path: Path) -> None:
    from stockade.testing.servers.postgres import drop_database, fresh_database, shared_server

    server = shared_server()
    name = fresh_database(server)
    stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}").close()
    try:
        done = floor(server.url(name), "--url", f"sqlite:///{tmp_path / 'coord.db'}")
        assert done.returncode == 2 and "install() never ran" in done.stderr and "Traceback" not in done.stderr
    finally:
        drop_database(server, name)
