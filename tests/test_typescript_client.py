"""The TypeScript client (clients/typescript, docs/typescript.md), tested from both sides.

- The contract vectors (clients/typescript/test/contract.json) are what
  scripts/ts_contract.py writes from the Python side: a test fails when the
  checked-in file is stale, with a control (an edited file is caught).
- The node suite (``node --test``) runs against a real `stockade serve`, a
  second one whose store accepts every token (the zombie tests' control), and a
  real PostgreSQL with the fence installed, all started here; their addresses
  go to node in the environment. The TypeScript is compiled with the pinned
  ``tsc`` first (``--strict``), so what runs is what the sources say.
  ``STOCKADE_TS_ROUNDS`` (50 with ``STOCKADE_LONG=1``) sets the zombie rounds.
  Without Node or ``npm ci`` the node suite skips, except under ``CI=true``,
  where it fails (scripts/test.sh installs both).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.server_fixtures import start_server

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
SCRIPT = ROOT / "scripts" / "ts_contract.py"
LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = int(os.environ.get("STOCKADE_TS_ROUNDS") or (50 if LONG else 3))


def _load_script():
    spec = importlib.util.spec_from_file_location("ts_contract_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contract_vectors_are_current() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_stale_contract_file_is_caught(monkeypatch, tmp_path, capsys) -> None:
    """Control: --check is not a no-op; a vector edited by hand makes it exit 1."""
    script = _load_script()
    stale = tmp_path / "contract.json"
    stale.write_text(script.TARGET.read_text().replace('"status": 409', '"status": 400', 1))
    monkeypatch.setattr(script, "TARGET", stale)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    assert script.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def _tools() -> tuple[str, Path]:
    node = shutil.which("node")
    tsc = PACKAGE / "node_modules" / ".bin" / "tsc"
    if node is None or not tsc.exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError("node or clients/typescript/node_modules is missing (scripts/test.sh installs them)")
        pytest.skip("node, or npm ci in clients/typescript, is missing (scripts/test.sh installs them)")
    return node, tsc


@pytest.fixture
def fenced_pg(pg_db, http_server) -> str:
    """A fresh database with the fence installed (the server's keys) and the table the workers take turns on."""
    import psycopg

    from stockade.resources.postgres import install

    server, name = pg_db
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        install(conn, keys=str(http_server.data_dir / "coord.keys"))
        conn.execute("CREATE TABLE shared (id int PRIMARY KEY, value text NOT NULL, token_value bigint)")
        conn.execute("INSERT INTO shared VALUES (1, 'initial', NULL)")
    return url


def test_node_suite(http_server, fenced_pg, tmp_path) -> None:
    """``node --test`` on the compiled client, against the servers and the database started here."""
    node, tsc = _tools()
    build = subprocess.run([str(tsc), "-p", str(PACKAGE)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    control = start_server(tmp_path / "control", control="fencing-off")
    try:
        env = dict(os.environ, STOCKADE_TS_URL=http_server.url, STOCKADE_TS_SERVER_PID=str(http_server.process.pid),
                   STOCKADE_TS_CONTROL_URL=control.url, STOCKADE_TS_PG_URL=fenced_pg,
                   STOCKADE_TS_PYTHON=sys.executable, STOCKADE_TS_ROUNDS=str(ROUNDS), CI=os.environ.get("CI", ""))
        result = subprocess.run(
            [node, "--test", "--test-concurrency=1", "--test-reporter=tap", "dist/test/"],
            cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=600 + ROUNDS * 60,
        )
    finally:
        control.stop()
    for line in re.findall(r"FIGURE (.*)", result.stdout):
        print(line)
    summary = dict(re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", result.stdout, re.M))
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert summary.get("fail") == "0" and summary.get("skipped") == "0" and summary.get("cancelled") == "0", summary
    assert int(summary["tests"]) >= 10, summary
