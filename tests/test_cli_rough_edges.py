"""The rough edges of the CLI and the HTTP API, each pinned: bench's data, progress, sim's replay, help, curl.

Each test names what a user saw before; the ones about the server run a real
`stockade serve` on a free loopback port.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS, python_env

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, request, start_server  # noqa: E402

from stockade.cli import SUBCOMMANDS  # noqa: E402

STOCKADE = [sys.executable, "-m", "stockade"]
DOCS = Path(__file__).resolve().parent.parent / "docs"
AUTH_TOKEN = "rough-edges-token-0123456789"
# floor's help is its owner's: it renders its docstring itself (see the report of this change).
HELP_RENDERED_ELSEWHERE: set[str] = set()


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    base = python_env()
    for name in ("STOCKADE_URL", "STOCKADE_DATA", "STOCKADE_TOKEN", "STOCKADE_AUTH_TOKEN"):
        base.pop(name, None)
    return subprocess.run([*STOCKADE, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


BENCH_SHORT = ("bench", "--seconds", "0.2", "--iters", "20", "--clients", "2", "--conc-mode", "threads")


def test_bench_without_url_uses_a_temporary_directory(tmp_path: Path) -> None:
    done = cli(*BENCH_SHORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []  # no ./stockade-data, no bench-* scopes in it
    progress = [line for line in done.stderr.splitlines() if line.startswith("stockade bench: [")]
    assert [line.split("]")[0] for line in progress] == ["stockade bench: [1/4", "stockade bench: [2/4",
                                                          "stockade bench: [3/4", "stockade bench: [4/4"]
    assert "lock r1" in done.stdout and "write r1" in done.stdout
    # $STOCKADE_DATA (set for lock and status) does not draw bench in either
    data = tmp_path / "data"
    assert cli(*BENCH_SHORT, cwd=tmp_path, env={"STOCKADE_DATA": str(data)}).returncode == 0
    assert not data.exists()


def test_bench_lock_keepalive_is_asked_for_by_name(tmp_path: Path) -> None:
    """Lock cycles with the keepalive on (what coord.lock() runs): only when named, never in the default run."""
    done = cli(*BENCH_SHORT, "--workloads", "lock-keepalive", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "lock-keepalive r1" in done.stdout and "write r1" not in done.stdout
    assert "lock-keepalive" in cli("bench", "--help", cwd=tmp_path).stdout


def test_bench_with_data_dir_keeps_its_files(tmp_path: Path) -> None:
    """The control of the test above: with --data-dir the bench-* scopes land there, as asked."""
    data = tmp_path / "data"
    done = cli(*BENCH_SHORT, "--data-dir", str(data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    status = cli("status", "--data-dir", str(data), "--json", cwd=tmp_path)
    scopes = [json.loads(line)["scope"] for line in status.stdout.splitlines()]
    assert scopes and all(scope.startswith("bench-") for scope in scopes)


def test_bench_help_names_the_serve_port() -> None:
    text = cli("bench", "--help", cwd=Path.cwd()).stdout
    # The serve port wherever a server is named (etcd's 2379 and ZooKeeper's 2181 are their own).
    ports = set(re.findall(r"http://[\w.]+:(\d+)", text)) | set(re.findall(r"port is (\d+)", text))
    assert ports == {"7390"} and "2379" in text, text


def test_sim_campaign_shows_progress(tmp_path: Path) -> None:
    done = cli("sim", "--seconds", "3", "--progress-s", "0.5", "--first-seed", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("stockade sim: ")]
    assert len(lines) >= 2, done.stderr
    done_counts = [int(re.search(r"([\d,]+) seeds done", line).group(1).replace(",", "")) for line in lines]  # type: ignore[union-attr]
    assert done_counts == sorted(done_counts)
    assert json.loads(done.stdout)["examples"] >= done_counts[-1]
    quiet = cli("sim", "--seeds", "3", "--progress-s", "0", "--first-seed", "1", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_sim_seed_prints_options_and_honours_json(tmp_path: Path) -> None:
    text = cli("sim", "--seed", "912", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    options_line = next(line for line in text.stdout.splitlines() if line.startswith("options: "))
    assert "clients=" in options_line and "ttl_ms=" in options_line
    as_json = cli("sim", "--seed", "912", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)  # the whole of stdout is one JSON object
    assert document["seed"] == 912 and document["violations"] == 0
    assert f"clients={document['options']['clients']}," in options_line
    assert f"steps {document['steps']}," in text.stdout  # the same run, two renderings


@pytest.mark.parametrize("command", sorted(set(SUBCOMMANDS) - HELP_RENDERED_ELSEWHERE))
def test_help_has_no_markup(command: str) -> None:
    done = cli(command, "--help", cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout and "`" not in done.stdout, done.stdout


def test_help_renderer_control() -> None:
    """The renderer itself: a docstring with markup comes out without it (and raw text would not)."""
    from stockade.cli._common import help_text

    raw = "``stockade kv``: see `stockade lock` and ``--token``."
    assert "`" in raw
    assert help_text(raw) == "stockade kv: see 'stockade lock' and --token."


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    tokens = tmp_path / "tokens"
    tokens.write_text(AUTH_TOKEN + "\n")
    process = start_server(tmp_path / "server", "--auth-tokens", str(tokens))
    yield process
    process.stop()


AUTH = {"Authorization": f"Bearer {AUTH_TOKEN}"}
FORM = {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}  # what curl -d and --data-binary send


def test_curl_default_content_type(server: ServerProcess) -> None:
    status, _, body = request(server.url, "POST", "/v1/locks/jobs/acquire", json_body={"ttl_ms": 30_000},
                              headers=AUTH)
    assert status == 200, body
    grant = json.loads(body)
    renew = request(server.url, "POST", f"/v1/leases/{grant['lease_id']}/renew", body=b"", headers=FORM)
    assert renew[0] == 200, renew
    put = request(server.url, "PUT", "/v1/kv/jobs/k", body=b"a=b&c", headers={**FORM, "Fencing-Token": grant["token"]})
    assert put[0] == 200, put
    got = request(server.url, "GET", "/v1/kv/jobs/k", headers=AUTH)
    assert got[0] == 200 and got[2] == b"a=b&c" and got[1]["content-type"] == "application/octet-stream"
    # Where the body is JSON it must say so: the strictness that stays (control of the two above)
    assert request(server.url, "POST", "/v1/locks/jobs/acquire", body=b'{"ttl_ms": 1000}', headers=FORM)[0] == 415
    renew_body = request(server.url, "POST", f"/v1/leases/{grant['lease_id']}/renew", body=b"{}", headers=FORM)
    assert renew_body[0] == 415


def test_root_is_a_status_page(server: ServerProcess) -> None:
    assert request(server.url, "GET", "/")[0] == 401  # needs the token, as /v1/locks does
    status, _, body = request(server.url, "POST", "/v1/locks/night.ly/acquire", json_body={"ttl_ms": 30_000},
                              headers=AUTH)
    assert status == 200
    status, headers, body = request(server.url, "GET", "/", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "<td>night.ly<td>held<td>anonymous" in page and "1 scopes, 1 leases, 0 waiters" in page
    assert request(server.url, "GET", "/?x=1", headers=AUTH)[0] == 400


def test_the_curl_walkthrough_in_the_docs(server: ServerProcess, tmp_path: Path) -> None:
    """docs/http-api.md's curl script, run as written (only its U= line pointed at this server)."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is needed to check the documented curl examples (apt-get install curl)")
    text = (DOCS / "http-api.md").read_text()
    block = re.search(r"## With curl.*?```sh\n(.*?)```", text, re.S)
    assert block is not None
    script = re.sub(r"^U=.*$", f"U={server.url}", block.group(1), count=1, flags=re.M)
    env = {**python_env(), "STOCKADE_AUTH_TOKEN": AUTH_TOKEN}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "day,total\n" in done.stdout  # the value read back
    last = json.loads(done.stdout[done.stdout.rindex('{"type"'):])
    assert last["status"] == 409 and last["type"].endswith("/stale-token") and last["high_water"] > 0
    final = request(server.url, "GET", "/v1/kv/reports/daily.csv", headers=AUTH)
    assert final[2] == b"day,total,late"  # the zombie changed nothing
    without_token = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=python_env(),
                                   capture_output=True, text=True, timeout=60)
    assert without_token.returncode != 0  # control: the server did check the header the script sends


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_history_and_status_read_only_the_file_named(tmp_path: Path, capsys, monkeypatch) -> None:
    """A typo in a data dir made `history` create an empty coordinator there (even /etc) and say 'no events';
    `status --url sqlite:///X/other.db` showed X/coord.db; a wrong --store-file was taken as an empty journal."""
    import stockade
    from stockade.cli import main as cli_main

    for name in ("STOCKADE_URL", "STOCKADE_DATA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo").mkdir()
    before = _files_under(tmp_path)
    assert cli_main(["history", "x", "--data-dir", str(tmp_path / "typo")]) == 1
    assert cli_main(["history", "x", "--data-dir", str(tmp_path / "no" / "such")]) == 1
    assert cli_main(["history", "x", "--url", f"sqlite:///{tmp_path}/nope/coord.db"]) == 1
    assert cli_main(["history", "x"]) == 1  # ./stockade-data does not exist
    assert cli_main(["history", "x", "--url", "memory://x"]) == 2  # bad input: memory:// is in-process
    err = capsys.readouterr().err
    assert err.count("no coordinator at") == 4 and "memory://" in err and "Traceback" not in err
    assert _files_under(tmp_path) == before  # nothing created

    data = tmp_path / "data"
    data.mkdir()
    coord = stockade.connect(f"sqlite:///{data}/coord.db")
    with coord.lock("x", ttl_ms=5_000):
        pass
    other = stockade.connect(f"sqlite:///{data}/other.db")
    with other.lock("only-in-other", ttl_ms=5_000):
        pass
    coord.close()
    other.close()
    capsys.readouterr()
    assert cli_main(["history", "x", "--data-dir", str(data)]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["grant", "release"]
    (tmp_path / "not-a-store").write_text("hello")
    for wrong in [tmp_path / "not-a-store", data / "coord.db"]:
        assert cli_main(["history", "x", "--data-dir", str(data), "--store-file", str(wrong)]) == 1
    err = capsys.readouterr().err
    assert "not a stockade store file" in err and "cannot read the store file" in err
    assert cli_main(["status", "--url", f"sqlite:///{data}/other.db", "--json"]) == 0
    assert [row["scope"] for row in map(json.loads, capsys.readouterr().out.splitlines())] == ["only-in-other"]
    assert cli_main(["status", "--url", f"sqlite:///{data}/missing.db"]) == 1
    assert not (data / "missing.db").exists()
