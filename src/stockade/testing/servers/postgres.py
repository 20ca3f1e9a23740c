"""A real PostgreSQL 15 for tests: initdb into a temporary directory, a free loopback port, fsync on.

PostgreSQL refuses to run as root, so when the tests run as root the server
runs as the ``postgres`` user (``runuser``) in a directory that user owns. The
server is stopped by its own pid (``pg_ctl stop -m immediate``, or SIGKILL of
the postmaster for the crash tests); nothing else is ever signalled.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_port as _free_port

BIN = Path("/usr/lib/postgresql/15/bin")
PSQL = str(BIN / "psql") if (BIN / "psql").exists() else "/usr/bin/psql"
SUPERUSER = "postgres"
START_TIMEOUT_S = 60


def available() -> bool:
    """Whether the binaries are installed (tests skip otherwise, and fail under CI=true)."""
    return (BIN / "initdb").exists() and (BIN / "pg_ctl").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child, not yet reaped) is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory.

    Args:
        settings: extra ``-c name=value`` settings for the server.
        datadir: an existing data directory to start (a base backup); None: initdb a new one.
        encoding: initdb's ``-E``; None: what ``initdb --locale C`` chooses itself (SQL_ASCII).
    """

    def __init__(self, settings: dict[str, str] | None = None, *, datadir: Path | None = None,
                 root: Path | None = None, encoding: str | None = "UTF8") -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="stockade-pg-"))
        os.chmod(self.root, 0o755)
        self.datadir = datadir or self.root / "data"
        self.port = _free_port()
        self.settings = {"fsync": "on", "synchronous_commit": "on", "max_connections": "60",
                         "shared_buffers": "32MB", **(settings or {})}
        self._chown(self.root)
        if datadir is None:
            self._run([str(BIN / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER, "-A", "trust",
                       "--no-sync", *(["-E", encoding] if encoding else []), "--locale", "C"])
        self.start()

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*_as_postgres(), *argv], check=check, capture_output=True, text=True,
                              timeout=START_TIMEOUT_S, cwd="/")

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres connect_timeout=10"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def dsn_of(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname} connect_timeout=10"

    def start(self) -> None:
        """Start the postmaster as our own child (so that we reap it: a zombie would hold postmaster.pid)."""
        argv = [str(BIN / "postgres"), "-D", str(self.datadir), "-c", "listen_addresses=127.0.0.1",
                "-c", f"port={self.port}", "-c", "unix_socket_directories="]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        with open(self.root / "server.log", "ab") as log:
            self._process = subprocess.Popen([*_as_postgres(), *argv], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd="/")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            ready = subprocess.run([str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                                    "-U", SUPERUSER], capture_output=True)
            if ready.returncode == 0:
                reaper.watch(self.pid())  # the postmaster, ended if this test process is killed
                return
            time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL did not start: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def pid(self) -> int:
        """The postmaster's pid (first line of postmaster.pid)."""
        return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])

    def kill9(self) -> None:
        """SIGKILL the postmaster and wait until it and its children are gone (a crash, not a shutdown)."""
        pid = self.pid()
        children = [int(p) for p in subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                                                   text=True).stdout.split()]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT_S
        for child in [pid, *children]:  # the children exit when they notice the postmaster died
            while time.monotonic() < deadline and _alive(child):
                time.sleep(0.02)
        self._process.wait(START_TIMEOUT_S)  # reap it (runuser exits with it)

    def stop(self) -> None:
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            self._run([str(BIN / "pg_ctl"), "stop", "-D", str(self.datadir), "-m", "immediate", "-w"], check=False)
            try:
                process.wait(START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def psql_argv(self, dbname: str = "postgres") -> list[str]:
        """The command line of a plain psql session on ``dbname`` (its own process, no stockade code)."""
        return [PSQL, "-X", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", dbname]

    def psql(self, sql: str, dbname: str = "postgres") -> subprocess.CompletedProcess[str]:
        """Run ``sql`` in a plain psql session; stops at the first error."""
        return subprocess.run([*self.psql_argv(dbname), "-v", "ON_ERROR_STOP=1", "-c", sql],
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


_shared: PostgresServer | None = None


def shared_server() -> PostgresServer:
    """One server for the whole test session (started on first use, stopped at exit)."""
    global _shared
    if _shared is None:
        _shared = PostgresServer()
        atexit.register(_shared.close)
    return _shared


_databases = 0


#: The database encodings the PostgreSQL tests run on: the server's own (UTF8), and SQL_ASCII, what
#: ``initdb`` makes under a C/POSIX locale (psycopg hands its text back as bytes).
ENCODINGS = ("UTF8", "SQL_ASCII")


def fresh_database(server: PostgresServer, encoding: str = "UTF8", settings: Mapping[str, str] | None = None) -> str:
    """A new empty database on ``server`` in ``encoding`` (one of `ENCODINGS`); its name.

    UTF8 copies ``template1`` (the server's encoding); any other encoding
    copies ``template0`` with the C locale, as PostgreSQL requires. ``settings``
    become the database's defaults (``ALTER DATABASE ... SET name = value``), what
    every later session on it starts with unless it sets its own: a user's database
    may be set so, e.g. ``default_transaction_isolation``.
    """
    global _databases
    import psycopg
    from psycopg import sql

    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}")
    _databases += 1
    name = f"t{os.getpid()}_{_databases}"
    options = "" if encoding == "UTF8" else f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{options}')
        for setting, value in (settings or {}).items():
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))
    return name


def drop_database(server: PostgresServer, name: str) -> None:
    import psycopg

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def keep_what_succeeds(conn: Any, statements: list[str]) -> list[str]:
    """Run each statement in a savepoint of ``conn``'s open transaction; the ones that succeeded, in order.

    An outsider's attempts on what it should not reach: what it could take stays held (in the
    transaction), and a refusal does not end the transaction for the attempts after it.
    """
    import psycopg

    kept: list[str] = []
    for statement in statements:
        conn.execute("SAVEPOINT attempt")
        try:
            conn.execute(statement)
        except psycopg.Error:
            conn.execute("ROLLBACK TO SAVEPOINT attempt")
        else:
            conn.execute("RELEASE SAVEPOINT attempt")
            kept.append(statement)
    return kept
