"""A full disk under the PostgreSQL coordinator's database, and under a database fenced by stockade.

The database lives on a small tmpfs that the test fills to the last byte. A
grant that needs room then fails as PostgreSQL fails it ("could not extend
file ..."): the caller gets `BackendUnavailable`, its text one line that
names the cause (never the server-side function's SQL, which PostgreSQL adds
to its error as CONTEXT lines), `stockade lock` says the same without a
traceback, no token is handed out twice, and once there is room again the
next grant on a scope is above every token that scope had. A fenced
transaction of the user's own rows fails the same way (one line, the fence's
SQL left out), and the scope's mark and rows stay as the last commit left them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import python_env
from helpers import full_disk

import stockade
from stockade.core.errors import BackendUnavailable

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

#: The tmpfs: initdb takes about 40 MB, a WAL segment 16 MB.
TMPFS_SIZE = "160m"
#: Grants on new scopes tried on the full disk before the test gives up (the pages' free room goes first).
GRANTS_ON_FULL_DISK_MAX = 20_000
#: `stockade lock` runs on new scopes tried on the full disk (each needs a new row, so each should fail).
CLI_RUNS_MAX = 5


@contextlib.contextmanager
def _postgres_on_a_small_disk() -> Iterator[tuple[Any, Path]]:
    """A real PostgreSQL 15 whose data directory is on a small tmpfs: ``(server, mount)``, stopped after."""
    from stockade.testing.servers import postgres as pg_helper

    if not pg_helper.available():
        if os.environ.get("CI") == "true":
            raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
        pytest.skip("PostgreSQL 15 is not installed")
    with full_disk.small_tmpfs(TMPFS_SIZE) as mount:
        (mount / "pg").mkdir()
        server = pg_helper.PostgresServer(root=mount / "pg")
        try:
            yield server, mount
        finally:
            server.close()


def test_a_full_disk_is_a_one_line_typed_error_and_no_token_goes_back() -> None:
    with _postgres_on_a_small_disk() as (server, mount):
        _full_disk_under_postgres(server, mount)


def _full_disk_under_postgres(server: Any, mount: Path) -> None:
    coord = None
    try:
        coord = stockade.connect(server.url())
        tokens: dict[str, list[int]] = {}

        def cycle(scope: str) -> None:
            lease = coord.acquire(scope, ttl_ms=60_000, wait_ms=0, keepalive=False)
            tokens.setdefault(scope, []).append(lease.token.value)
            lease.release()

        for _ in range(5):
            cycle("a")
        full_disk.fill(mount / "filler")

        refused = None
        for i in range(GRANTS_ON_FULL_DISK_MAX):
            try:
                cycle(f"new-{i}")
            except BackendUnavailable as exc:
                refused = exc
                break
        assert refused is not None, f"{GRANTS_ON_FULL_DISK_MAX} grants on new scopes fit on a full disk"
        text = str(refused)
        assert "No space left on device" in text and "SQLSTATE 53100" in text, text
        assert "\n" not in text and "CONTEXT" not in text and "stockade_coord_" not in text, text
        # Control: PostgreSQL's own text of the same error carries the function's SQL.
        # (The grant or the release ran out of room, whichever needed a page first.)
        assert "CONTEXT" in str(refused.__cause__) and "PL/pgSQL function stockade_coord_" in str(refused.__cause__)

        failed = None
        for i in range(CLI_RUNS_MAX):
            done = subprocess.run([sys.executable, "-m", "stockade", "lock", f"cli-{i}", "--url", server.url(),
                                   "--ttl-ms", "5000", "--", "true"], capture_output=True, text=True, timeout=120,
                                  env=python_env())
            assert "Traceback" not in done.stderr, done.stderr
            if done.returncode != 0:
                failed = done
                break
        assert failed is not None, "stockade lock found room for a new scope on a full disk"
        assert "No space left on device" in failed.stderr and "CONTEXT" not in failed.stderr, failed.stderr

        (mount / "filler").unlink()
        cycle("a")
        cycle("after")  # not the refused scope: a refused release leaves its lease to its TTL
        for scope, values in tokens.items():
            assert values == sorted(set(values)), (scope, values)  # strictly increasing within each scope
        assert len(tokens["a"]) == 6
    finally:
        if coord is not None:
            coord.close()


def test_a_fenced_transaction_on_a_full_disk_is_one_line_and_keeps_the_mark() -> None:
    import psycopg

    from stockade.resources.postgres import fenced, high_waters, install
    from stockade.testing.conformance.fence import KEYS, tok

    with _postgres_on_a_small_disk() as (server, mount):
        with psycopg.connect(server.url(), autocommit=True) as conn:
            install(conn, keys=KEYS)
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text)")
            with fenced(conn, tok(5)):
                conn.execute("INSERT INTO orders VALUES (1, 'paid')")
            full_disk.fill(mount / "filler")
            refused = None
            for i in range(2, 2 + GRANTS_ON_FULL_DISK_MAX):
                try:
                    with fenced(conn, tok(6)):
                        conn.execute("INSERT INTO orders VALUES (%s, repeat('x', 2000))", (i,))
                except BackendUnavailable as exc:
                    refused = exc
                    break
            assert refused is not None, "a full disk took every fenced insert"
            assert "No space left on device" in str(refused) and "\n" not in str(refused), str(refused)
            (mount / "filler").unlink()
            assert high_waters(conn)["a"] in (5, 6)  # 6 once an insert of token 6 fitted
            assert conn.execute("SELECT count(*) FROM orders WHERE id = %s", (i,)).fetchone() == (0,)
            with pytest.raises(stockade.StaleToken):
                with fenced(conn, tok(4)):
                    conn.execute("UPDATE orders SET state = 'zombie' WHERE id = 1")
            assert conn.execute("SELECT state FROM orders WHERE id = 1").fetchone() == ("paid",)
