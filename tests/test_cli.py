"""The command line, run as a user would: real subprocesses, real signals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import python_env

STOCKADE = [sys.executable, "-m", "stockade"]


def run(args, tmp_path, **kw):
    env = python_env()
    env["STOCKADE_DATA"] = str(tmp_path / "data")
    return subprocess.run(STOCKADE + args, capture_output=True, text=True, env=env, timeout=60, **kw)


def test_demo_shows_stale_write_rejected(tmp_path):
    result = run(["demo"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REJECTED: StaleToken" in result.stdout
    assert "fencing held" in result.stdout


def test_demo_keep_leaves_its_files_and_says_how_to_read_them(tmp_path):
    result = run(["demo", "--keep"], tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    command = result.stdout.strip().splitlines()[-1].split()
    assert command[:3] == ["stockade", "history", "--data-dir"], result.stdout
    kept = Path(command[3])
    try:
        assert (kept / "coord.db").is_file() and (kept / "store.db").is_file()
        history = run(command[1:], tmp_path)
        assert history.returncode == 0 and "grant" in history.stdout and "reject" in history.stdout, history.stdout
    finally:
        shutil.rmtree(kept)


def test_demo_control_without_fencing_fails(tmp_path):
    # the same story against a store that ignores tokens must not pass
    result = run(["demo", "--store-class", "stockade.testing.mutants:FencingOffStore"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ACCEPTED" in result.stdout and "did NOT play out" in result.stdout


def test_lock_passes_token_and_exit_status(tmp_path):
    result = run(["lock", "jobs", "--", sys.executable, "-c",
                  "import os,sys; print(os.environ['STOCKADE_TOKEN']); sys.exit(7)"], tmp_path)
    assert result.returncode == 7, result.stderr
    token = result.stdout.strip()
    # signed (docs/tokens.md); the value is this opener's epoch
    assert re.fullmatch(r"stk2\.[0-9a-f]{16}\.[1-9][0-9]*\.[0-9a-f]{8}\.[A-Za-z0-9_-]{22}\.jobs", token), token
    result = run(["lock", "jobs", "--", "true"], tmp_path)
    assert result.returncode == 0


def test_lock_timeout_exit_75_while_held(tmp_path):
    holder = subprocess.Popen(
        # holds the lock until told to end (a line on stdin): no sleep to outlast on a busy machine
        STOCKADE + ["lock", "jobs", "--", sys.executable, "-c",
                    "import sys; print('in', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**python_env(), "STOCKADE_DATA": str(tmp_path / "data")},
    )
    try:
        assert holder.stdout.readline().strip() == "in"
        result = run(["lock", "jobs", "--wait-ms", "100", "--", "true"], tmp_path)
        assert result.returncode == 75 and "still held" in result.stderr
    finally:
        holder.communicate("done\n", timeout=60)


def test_lock_stops_command_when_lease_lost(tmp_path):
    # The command freezes its own `stockade lock` parent past the TTL (a real SIGSTOP),
    # so the keepalive cannot renew; on resume the lease is lost and CMD gets SIGTERM.
    script = "import os,signal,time; p=os.getppid(); os.kill(p, signal.SIGSTOP); time.sleep(1.0); " \
             "os.kill(p, signal.SIGCONT); time.sleep(20); print('not stopped')"
    result = run(["lock", "jobs", "--ttl-ms", "300", "--grace-ms", "1000", "--", sys.executable, "-c", script],
                 tmp_path)
    assert result.returncode == 128 + 15, (result.returncode, result.stderr)
    assert "lost" in result.stderr and "not stopped" not in result.stdout


def test_lock_bad_arguments(tmp_path):
    assert run(["lock", "bad name", "--", "true"], tmp_path).returncode == 2
    assert run(["lock", "jobs"], tmp_path).returncode == 2
    assert run(["lock", "jobs", "--ttl-ms", "5", "--", "true"], tmp_path).returncode == 2


def test_status_lists_scopes_tokens_and_high_water(tmp_path):
    script = ("import os, stockade; c = stockade.connect('sqlite:///' + os.environ['STOCKADE_DATA'] + '/coord.db'); "
              "s = stockade.open_store('sqlite:///' + os.environ['STOCKADE_DATA'] + '/store.db', "
              "cluster_id=c.cluster_id); s.put('jobs', 'k', b'v', token=os.environ['STOCKADE_TOKEN'])")
    assert run(["lock", "jobs", "--", sys.executable, "-c", script], tmp_path).returncode == 0
    result = run(["status", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.splitlines()[0])
    assert row["last_token"] >= 1 and row["high_water"] == row["last_token"]  # the one token issued, accepted
    assert row == {"scope": "jobs", "state": "free", "holder": None, "token": None, "last_token": row["last_token"],
                   "remaining_ms": 0, "waiters": 0, "high_water": row["last_token"]}
    table = run(["status"], tmp_path).stdout
    assert "jobs" in table and "HIGH-WATER" in table


def test_status_without_data_is_a_clear_error(tmp_path):
    result = run(["status"], tmp_path)
    assert result.returncode == 1 and "no coordinator" in result.stderr and "Traceback" not in result.stderr


def test_unknown_command(tmp_path):
    result = run(["frobnicate"], tmp_path)
    assert result.returncode == 2 and "unknown command" in result.stderr


def test_version_prints_the_package_version(tmp_path):
    import tomllib
    from pathlib import Path

    import stockade

    result = run(["--version"], tmp_path)
    assert result.returncode == 0 and result.stdout == f"stockade {stockade.__version__}\n", result
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    # one release number: the package's metadata reads it from __version__ (the wheel's: tests/test_package.py)
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "stockade.__version__"}


def test_package_ships_py_typed():
    from pathlib import Path

    import stockade

    assert (Path(stockade.__file__).parent / "py.typed").is_file()


def test_demo_bad_data_dir_is_a_clear_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    for bad in (a_file, a_file / "sub"):
        result = run(["demo", "--data-dir", str(bad)], tmp_path)
        assert result.returncode == 2, (bad, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr and f"--data-dir {bad}:" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert a_file.read_text() == "not a directory"


def test_lock_bad_data_dir_is_a_clear_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = run(["lock", "jobs", "--data-dir", str(a_file), "--", "true"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "a-file" in result.stderr, result.stderr
