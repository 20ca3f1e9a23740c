"""A PostgreSQL 15 primary with a streaming standby (``pg_basebackup -R``), promoted with ``pg_ctl promote``.

Built on `stockade.testing.servers.postgres.PostgresServer` (each server a real postmaster on a
free loopback port, stopped by its own pid). The standby is asynchronous
unless ``synchronous=True`` (``synchronous_standby_names = '*'``: a commit
returns only after the standby flushed it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from stockade.testing.servers.postgres import BIN, SUPERUSER, PostgresServer, _as_postgres

WAIT_S = 60.0


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except psycopg.Error:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def standby_of(primary: PostgresServer) -> PostgresServer:
    """A streaming standby of ``primary``, started (``pg_basebackup -R -X stream``)."""
    root = Path(tempfile.mkdtemp(prefix="stockade-pg-standby-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run([*_as_postgres(), str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
                    "-U", SUPERUSER, "-D", str(root / "data"), "-R", "-X", "stream", "-c", "fast"],
                   check=True, capture_output=True, timeout=WAIT_S, cwd="/")
    return PostgresServer(datadir=root / "data", root=root)


def promote(standby: PostgresServer) -> None:
    """``pg_ctl promote``, then wait until the server accepts writes."""
    subprocess.run([*_as_postgres(), str(BIN / "pg_ctl"), "promote", "-D", str(standby.datadir), "-w"],
                   check=True, capture_output=True, timeout=WAIT_S, cwd="/")

    def promoted() -> bool:
        with psycopg.connect(standby.dsn, autocommit=True) as conn:
            return not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]

    wait_until(promoted, "the standby's promotion")


def make_synchronous(primary: PostgresServer) -> None:
    """Every commit on ``primary`` waits for the standby's flush from now on."""
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        conn.execute("SELECT pg_reload_conf()")
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                   .fetchone()[0] == 1, "the standby to be synchronous")


def replayed(primary: PostgresServer, standby: PostgresServer) -> bool:
    """Whether the standby has replayed everything the primary wrote so far.

    So far: to the WAL's insert position, not its write position, which is behind it while a commit
    that did not wait for its flush (a release, docs/coordinator-postgres.md) is in the WAL buffers.
    """
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    with psycopg.connect(standby.dsn, autocommit=True) as conn:
        return bool(conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(lsn),)).fetchone()[0])


class Pair:
    """A primary and its standby; ``url`` names both (libpq multi-host, ``target_session_attrs=read-write``)."""

    def __init__(self, *, synchronous: bool = False) -> None:
        self.primary = PostgresServer()
        try:
            self.standby = standby_of(self.primary)
            if synchronous:
                make_synchronous(self.primary)
        except BaseException:
            self.primary.close()
            raise

    @property
    def url(self) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://{SUPERUSER}@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=5"

    def wait_replayed(self) -> None:
        wait_until(lambda: replayed(self.primary, self.standby), "the standby to replay the primary")

    def close(self) -> None:
        self.standby.close()
        self.primary.close()
