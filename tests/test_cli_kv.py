"""``stockade kv`` from shell scripts under ``stockade lock --url``: two hosts, one server, a stale token refused.

Two "hosts" (two working directories with no data of their own) run the same
script under ``stockade lock --url ... jobs``. The script marks its start,
waits (bounded) for the other host to start, writes with the lease's token
(`$STOCKADE_TOKEN`), then writes again with the token the *other* host saved
from its earlier lease, and marks its end. The verdict reads only the order
of the marks and the exit statuses:

- the lease serialises the scripts: no start falls between another host's
  start and end (the waiting host starts only after the first one ended);
- the second script's write with the first host's token is refused with exit
  4 and one line naming the high-water mark, and the value stays its own.

The control is the same run against a server whose store ignores tokens
(`stockade.testing.mutants.FencingOffStore`): there the stale write is
accepted, and the verdict must say so. A second control runs the scripts
without the lock: there they interleave.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HELPERS, python_env

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, start_server  # noqa: E402

STOCKADE = [sys.executable, "-m", "stockade"]
OTHER_START_WAIT_S = 2  # how long a script waits for the other to start; only the order is judged

SCRIPT = r"""
set -u
kv() { "$PYTHON" -m stockade kv "$@"; }
echo "start $ID" >> "$SHARED/log"
: > "$SHARED/started-$ID"
i=0
while [ "$i" -lt $((WAIT_S * 20)) ] && [ "$(ls "$SHARED" | grep -c '^started-')" -lt 2 ]; do
  sleep 0.05; i=$((i + 1))
done
kv put jobs result "from $ID" > /dev/null
echo "put $ID $?" >> "$SHARED/log"
for saved in "$SHARED"/token-*; do
  [ -f "$saved" ] || continue
  kv put jobs result "zombie $ID" --token "$(cat "$saved")" > /dev/null 2> "$SHARED/stale-$ID.err"
  echo "stale $ID $?" >> "$SHARED/log"
done
printf '%s' "$STOCKADE_TOKEN" > "$SHARED/token-$ID"
echo "end $ID" >> "$SHARED/log"
"""


def _env(shared: Path, ident: str) -> dict[str, str]:
    env = python_env()
    for name in ("STOCKADE_URL", "STOCKADE_DATA", "STOCKADE_TOKEN", "STOCKADE_AUTH_TOKEN"):
        env.pop(name, None)
    env.update(SHARED=str(shared), ID=ident, PYTHON=sys.executable, WAIT_S=str(OTHER_START_WAIT_S))
    return env


def _run_hosts(tmp_path: Path, url: str, *, locked: bool) -> tuple[list[str], dict[str, str], list[int]]:
    """Run the script on two hosts at once; returns the log lines, the stale writes' stderr, the exit statuses."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "script.sh"
    script.write_text(SCRIPT)
    processes = []
    for ident in ("h1", "h2"):
        host = tmp_path / ident
        host.mkdir()
        env = _env(shared, ident)
        if locked:
            command = [*STOCKADE, "lock", "--url", url, "--wait-ms", "60000", "jobs", "--", "sh", str(script)]
        else:  # the control: the same script with a token of its own, no lease around it
            grant = subprocess.run([*STOCKADE, "lock", "--url", url, "jobs", "--", "sh", "-c",
                                    'printf %s "$STOCKADE_TOKEN"'], env=env, capture_output=True, text=True,
                                   timeout=60)
            env["STOCKADE_TOKEN"], env["STOCKADE_URL"] = grant.stdout, url
            command = ["sh", str(script)]
        processes.append(subprocess.Popen(command, cwd=host, env=env, stderr=subprocess.PIPE, text=True))
    statuses = [p.wait(timeout=120) for p in processes]
    for p in processes:
        assert p.stderr is not None
        assert "Traceback" not in p.stderr.read()
    for ident in ("h1", "h2"):
        assert list((tmp_path / ident).iterdir()) == []  # the hosts keep no data: it is all on the server
    errors = {path.name: path.read_text() for path in shared.glob("stale-*.err")}
    return (shared / "log").read_text().splitlines(), errors, statuses


def _verdict(log: list[str], errors: dict[str, str]) -> list[str]:
    """What went wrong, judged by the order of the marks and the exit statuses (empty: all held)."""
    problems = []
    starts = [line.split()[1] for line in log if line.startswith("start ")]
    inside = None
    for line in log:
        kind, ident = line.split()[:2]
        if kind == "start":
            if inside is not None:
                problems.append(f"{ident} started while {inside} held the lease")
            inside = ident
        elif kind == "end" and inside == ident:
            inside = None
    puts = [line for line in log if line.startswith("put ")]
    if len(puts) != 2 or any(not line.endswith(" 0") for line in puts):
        problems.append(f"a write with the lease's own token failed: {puts}")
    stale = [line for line in log if line.startswith("stale ")]
    if [line.split()[2] for line in stale] != ["4"]:
        problems.append(f"the stale write was not refused with exit 4: {stale}")
    for name, text in errors.items():
        lines = text.strip().splitlines()
        if len(lines) != 1 or "fenced out" not in text or "high-water mark" not in text:
            problems.append(f"{name}: not one clear line: {text!r}")
    if len(starts) != 2:
        problems.append(f"starts: {starts}")
    return problems


def _start_fencing_off(data_dir: Path) -> ServerProcess:
    """A `stockade serve` whose store accepts every token (the control)."""
    data_dir.mkdir(parents=True)
    launcher = data_dir / "fencing_off.py"
    launcher.write_text(
        "import sys\n"
        "from stockade.server import app\n"
        "from stockade.testing.mutants import FencingOffStore\n"
        "app.SQLiteStore = FencingOffStore\n"
        "from stockade.cli import serve\n"
        "sys.exit(serve.run(sys.argv[1:]))\n"
    )
    log = data_dir / "server.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(launcher), "--data-dir", str(data_dir), "--port", "0"],
                                stdout=subprocess.PIPE, stderr=stderr, env=python_env())
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    line = b""
    while time.monotonic() < deadline and b"listening on" not in line and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            line = proc.stdout.readline()
    if b"listening on" not in line:
        proc.kill()
        raise RuntimeError(f"control server did not start: {log.read_text()[-2000:]}")
    return ServerProcess(proc, line.decode().split()[-1], data_dir, log)


@pytest.mark.parametrize("variant", ["stockade", "control-fencing-off", "control-no-lock"])
def test_two_hosts_one_server(tmp_path: Path, variant: str) -> None:
    if variant == "control-fencing-off":
        server = _start_fencing_off(tmp_path / "server")
    else:
        server = start_server(tmp_path / "server")
    try:
        log, errors, statuses = _run_hosts(tmp_path, server.url, locked=variant != "control-no-lock")
        final = subprocess.run([*STOCKADE, "kv", "get", "jobs", "result", "--url", server.url], env=python_env(),
                               capture_output=True, timeout=60)
    finally:
        server.stop()
    problems = _verdict(log, errors)
    print(f"{variant}: {len(problems)} problem(s) in {len(log)} marks: {problems}")
    assert statuses == [0, 0]
    if variant == "stockade":
        assert problems == [], log
        second = [line.split()[1] for line in log if line.startswith("start ")][1]
        assert final.stdout == f"from {second}".encode()  # the zombie's write changed nothing
    elif variant == "control-fencing-off":
        assert any("stale write was not refused" in p for p in problems), log
        assert final.stdout.startswith(b"zombie")
    else:
        assert any("started while" in p for p in problems), log


def test_kv_exit_codes_and_messages(tmp_path: Path) -> None:
    """Each documented exit status, each with one line on stderr and no traceback (local data directory)."""
    env = {**_env(tmp_path, "x"), "STOCKADE_DATA": str(tmp_path / "data")}

    def kv(*args: str, stdin: bytes = b"", extra: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        done = subprocess.run([*STOCKADE, "kv", *args], input=stdin, env={**env, **(extra or {})},
                              capture_output=True, timeout=60)
        stderr = done.stderr.decode()
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 1, stderr
        return done.returncode, done.stdout, stderr

    assert kv("get", "jobs", "k")[0] == 3  # no store yet: no such key
    assert kv("put", "jobs", "k", "v")[0] == 2  # no token
    grant = subprocess.run([*STOCKADE, "lock", "jobs", "--", "sh", "-c", 'printf %s "$STOCKADE_TOKEN"'], env=env,
                           capture_output=True, text=True, timeout=60)
    old = grant.stdout
    assert kv("put", "jobs", "k", "-", stdin=b"\x00bytes\xff", extra={"STOCKADE_TOKEN": old})[0] == 0
    assert kv("get", "jobs", "k")[:2] == (0, b"\x00bytes\xff")
    newer = subprocess.run([*STOCKADE, "lock", "jobs", "--", *STOCKADE, "kv", "put", "jobs", "k", "new"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert newer.returncode == 0, newer.stderr
    status, _, stderr = kv("put", "jobs", "k", "zombie", "--token", old)
    assert status == 4 and "fenced out" in stderr and "high-water mark" in stderr
    assert kv("delete", "jobs", "k", "--token", old)[0] == 4
    assert kv("put", "other", "k", "v", "--token", old)[0] == 5  # another scope's token
    assert kv("put", "jobs", "k", "v", "--token", "garbage")[0] == 2
    assert kv("put", "jobs", "k", "-", stdin=b"x" * (1024 * 1024 + 1), extra={"STOCKADE_TOKEN": old})[0] == 2
    assert kv("get", "jobs", "k")[:2] == (0, b"new")
    assert kv("get", "jobs", "missing")[0] == 3
    assert kv("get", "jobs", "k", "--url", "http://127.0.0.1:1")[0] == 1  # nothing listens there
    assert os.path.exists(tmp_path / "data" / "store.db")
