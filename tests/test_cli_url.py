"""The CLI reaches any coordinator: ``--url`` and ``$STOCKADE_URL`` for lock, status and demo, against a real server.

Each "host" is its own working directory with no data of its own: whatever
the commands do goes to the one `stockade serve`, and nothing is created in
the working directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS, free_port, python_env

from stockade.coordinators.registry import COORDINATORS

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, start_server  # noqa: E402

STOCKADE = [sys.executable, "-m", "stockade"]
AUTH_TOKEN = "cli-url-test-token-0123456789"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    base = python_env()
    for name in ("STOCKADE_URL", "STOCKADE_DATA", "STOCKADE_TOKEN", "STOCKADE_AUTH_TOKEN"):
        base.pop(name, None)
    return subprocess.run([*STOCKADE, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    process = start_server(tmp_path / "server")
    yield process
    process.stop()


@pytest.fixture
def host(tmp_path: Path) -> Path:
    directory = tmp_path / "host"
    directory.mkdir()
    return directory


def test_lock_and_status_with_url(server: ServerProcess, host: Path) -> None:
    probe = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('STOCKADE_')}))"
    done = cli("lock", "--url", server.url, "jobs", "--", sys.executable, "-c", probe, cwd=host)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["STOCKADE_URL"] == server.url
    assert seen["STOCKADE_TOKEN"].startswith("stk2.") and seen["STOCKADE_SCOPE"] == "jobs"
    assert "STOCKADE_DATA" not in seen  # a server has no data directory here

    status = cli("status", "--url", server.url, "--json", cwd=host)
    assert status.returncode == 0, status.stderr
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    last = int(seen["STOCKADE_TOKEN_VALUE"])
    assert [(r["scope"], r["state"], r["last_token"]) for r in rows] == [("jobs", "free", last)]

    table = cli("status", cwd=host, env={"STOCKADE_URL": server.url})  # the same server from the environment
    assert table.returncode == 0, table.stderr
    assert f"coordinator {server.url}" in table.stdout and "jobs" in table.stdout
    assert list(host.iterdir()) == []  # nothing written on the "host"


def test_data_dir_given_beats_the_environment(server: ServerProcess, host: Path) -> None:
    """Inside `stockade lock --url`, a command that names --data-dir gets that directory, not the server."""
    local = host / "local"
    done = cli("lock", "--data-dir", str(local), "mine", "--", "true", cwd=host, env={"STOCKADE_URL": server.url})
    assert done.returncode == 0, done.stderr
    assert (local / "coord.db").exists()
    remote = cli("status", "--url", server.url, "--json", cwd=host)
    assert "mine" not in remote.stdout  # control: the server never saw it
    mine = cli("status", "--data-dir", str(local), "--json", cwd=host, env={"STOCKADE_URL": server.url})
    assert [json.loads(line)["scope"] for line in mine.stdout.splitlines()] == ["mine"]


# Every command that reaches a coordinator by url, with the arguments it needs besides the url.
URL_COMMANDS = {
    "lock": ["jobs", "--", "true"], "status": [], "kv": ["get", "jobs", "k"], "history": ["jobs"], "ui": [],
    "floor": ["sqlite:///store.db", "--dry-run"],
}


def test_unreachable_server_is_one_line(host: Path) -> None:
    """The backend could not be reached: exit 1 (EXIT_REFUSED), one line, from every command."""
    url = f"http://127.0.0.1:{free_port()}"
    for command, rest in URL_COMMANDS.items():
        done = cli(command, "--url", url, *rest, cwd=host)
        assert done.returncode == 1, (command, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_bad_url_is_exit_2_from_every_command(host: Path) -> None:
    """Bad input is exit 2 (EXIT_USAGE) whichever command is given it; history and ui said 1 before."""
    for command, rest in URL_COMMANDS.items():
        done = cli(command, "--url", "postgresq://db/x", *rest, cwd=host)
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert list(host.iterdir()) == []


@pytest.mark.parametrize(("url", "said"), [
    ("HTTP://127.0.0.1:7390", "unknown scheme 'HTTP' (schemes are lower case: http://)"),
    (" sqlite:///coord.db", "unknown scheme ' sqlite' (the url has spaces before it)"),
    ("postgresq://db/x", "unknown scheme 'postgresq'; supported: " + ", ".join(sorted(COORDINATORS))),
])
def test_a_mistyped_scheme_says_what_is_wrong_and_creates_nothing(host: Path, url: str, said: str) -> None:
    done = cli("lock", "--url", url, "jobs", "--", "true", cwd=host)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and list(host.iterdir()) == []


@pytest.fixture
def auth_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    tokens = tmp_path / "tokens"
    tokens.write_text(AUTH_TOKEN + "\n")
    process = start_server(tmp_path / "auth-server", "--auth-tokens", str(tokens))
    yield process
    process.stop()


def test_bearer_token_from_the_environment(auth_server: ServerProcess, host: Path) -> None:
    env = {"STOCKADE_URL": auth_server.url}
    refused = cli("lock", "jobs", "--", "true", cwd=host, env=env)  # the control: without the token, refused
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    env["STOCKADE_AUTH_TOKEN"] = AUTH_TOKEN
    script = f"{sys.executable} -m stockade kv put jobs k v"
    done = cli("lock", "jobs", "--", "sh", "-c", script, cwd=host, env=env)
    assert done.returncode == 0, done.stderr
    status = cli("status", "--json", cwd=host, env=env)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert row["scope"] == "jobs" and row["high_water"] == row["last_token"]


def test_demo_on_a_server(server: ServerProcess, host: Path) -> None:
    done = cli("demo", "--url", server.url, cwd=host, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fencing held" in done.stdout and "REJECTED" in done.stdout
    status = cli("status", "--url", server.url, "--json", cwd=host)
    scopes = [json.loads(line)["scope"] for line in status.stdout.splitlines()]
    assert len(scopes) == 1 and scopes[0].startswith("demo-")  # its own scope, nothing else touched
    assert list(host.iterdir()) == []


def test_keys_takes_no_url(host: Path) -> None:
    done = cli("keys", "show", "--url", "http://127.0.0.1:7390", cwd=host)
    assert done.returncode == 2 and "show and rotate take no --url" in done.stderr
    assert os.listdir(host) == []
