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

import fcntl
import importlib.util
import json
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


def test_the_package_packs_its_built_sources_only(tmp_path_factory) -> None:
    """``npm pack`` ships the compiled client (JavaScript, declarations) and its sources, not the tests."""
    _built(tmp_path_factory)
    npm = shutil.which("npm")
    assert npm is not None
    packed = subprocess.run([npm, "pack", "--dry-run", "--json"], cwd=PACKAGE, capture_output=True, text=True,
                            timeout=120)
    assert packed.returncode == 0, packed.stderr
    files = {entry["path"] for entry in json.loads(packed.stdout)[0]["files"]}
    for needed in ("package.json", "dist/src/index.js", "dist/src/index.d.ts", "dist/src/pg.js", "src/client.ts"):
        assert needed in files, sorted(files)
    assert not [f for f in files if f.startswith(("dist/test", "test/", "node_modules"))], sorted(files)


def _built(tmp_path_factory) -> tuple[str, Path]:
    """Node and tsc, once the package is compiled (``tsc -p``) in this run: once, under a lock, whichever test and
    xdist worker asks first, so that no test reads dist/ while another rewrites it."""
    node, tsc = _tools()
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one directory for this run's workers
    with open(shared / "typescript-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "typescript-built"
        if not done.exists():
            # --skipLibCheck: the package's sources are checked as its tsconfig says (--strict and the rest); only
            # the pinned declaration files of node_modules are not checked again (about 2.4 s of the 5.6 s of CPU).
            build = subprocess.run([str(tsc), "-p", str(PACKAGE), "--skipLibCheck"], capture_output=True, text=True,
                                   timeout=300)
            assert build.returncode == 0, build.stdout + build.stderr
            done.touch()
    return node, tsc


def _tools() -> tuple[str, Path]:
    node = shutil.which("node")
    tsc = PACKAGE / "node_modules" / ".bin" / "tsc"
    if node is None or not tsc.exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError("node or clients/typescript/node_modules is missing (scripts/test.sh installs them)")
        pytest.skip("node, or npm ci in clients/typescript, is missing (scripts/test.sh installs them)")
    return node, tsc


@pytest.fixture
def fenced_pg(pg_db, http_server):
    """A fresh database with the fence installed (the server's keys; supersession after 300 ms) and the tables
    the workers and the docs' example write, as a url of a role that is not a superuser (PostgreSQL lets
    only a superuser end a superuser's session, so a paused superuser could not be superseded)."""
    import psycopg

    from stockade.resources.postgres import install

    server, name = pg_db
    app = f"{name}_app"
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {app} LOGIN")
        install(conn, keys=str(http_server.data_dir / "coord.keys"), supersede_after_ms=300)
        conn.execute("CREATE TABLE shared (id int PRIMARY KEY, value text NOT NULL, token_value bigint)")
        conn.execute("INSERT INTO shared VALUES (1, 'initial', NULL)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text)")  # docs/typescript.md's example
        conn.execute("INSERT INTO orders VALUES (42, 'new')")
        conn.execute(f"GRANT ALL ON shared, orders TO {app}")
    yield server.url(name).replace(f"//{server.url(name).split('//', 1)[1].split('@', 1)[0]}@", f"//{app}@")
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {app}")
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{app}'")
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {app}")


def doc_blocks() -> list[tuple[str, str]]:
    """The ``ts`` code blocks of README.md and docs/typescript.md: (where, code)."""
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "typescript.md"):
        text = doc.read_text()
        for match in re.finditer(r"^```ts\n(.*?)^```", text, re.M | re.S):
            found.append((f"{doc.name}:{text[:match.start()].count(chr(10)) + 1}", match.group(1)))
    return found


def _run_doc_blocks(node: str, tsc: Path, server_url: str, pg_url: str) -> list[str]:
    """Each block type-checked (strict) and run as written, the server's address in place of the default port."""
    out = PACKAGE / "dist" / "doc-examples"  # inside the package: "stockade-client" resolves to itself
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    blocks = doc_blocks()
    files = []
    for i, (_where, code) in enumerate(blocks):
        path = out / f"block{i}.mts"
        path.write_text(code.replace("http://127.0.0.1:7390", server_url))
        files.append(path)
    check = subprocess.run([str(tsc), "--strict", "--noEmit", "--module", "nodenext", "--moduleResolution", "nodenext",
                            "--target", "es2022", "--types", "node", "--skipLibCheck", *map(str, files)],
                           cwd=PACKAGE, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    ran = []
    for (where, _), path in zip(blocks, files, strict=True):
        script = path.with_suffix(".mjs")
        script.write_text(path.read_text())  # the blocks use no type syntax: the checked text runs as is
        result = subprocess.run([node, str(script)], cwd=PACKAGE, env=dict(os.environ, DATABASE_URL=pg_url),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{where}: {result.stdout}{result.stderr}"
        ran.append(where)
    return ran


def test_node_suite(http_server, fenced_pg, tmp_path, tmp_path_factory) -> None:
    """``node --test`` on the compiled client, against the servers and the database started here."""
    node, tsc = _built(tmp_path_factory)
    assert len(_run_doc_blocks(node, tsc, http_server.url, fenced_pg)) >= 3
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
