"""``sqlite:///coord.db`` (``process=host``, the default): one coordinator process per host owns the file.

Real processes throughout: the host process is the one the clients start
(``stockade serve --host-file``), killed with a real SIGKILL; clients that start
it at once are real processes let go together. What is checked:

- tokens never go down when one file is used embedded, then through its host
  process, then embedded again, then through a new host process (C1/C2);
- a host process killed with SIGKILL loses nothing committed (grants as they
  were answered, releases as a grant answered after them committed them: a
  release is answered before its commit, as by `stockade serve`, and one lost
  leaves its lease held, tests/test_serve_release_lag.py; the held leases held a
  full TTL from the restart, C3), and the next call of a client starts a new
  one; the control, a client that does not start the process, fails instead;
- one writer kind at a time: an embedded open is refused while the host process
  runs, and the host process does not start while an embedded process has the file
  (the default url then says, in one line, to add ``?process=embedded``; no wait, even
  when that embedded process is frozen);
- ``stockade serve --coordinator sqlite:///F`` opens F in its own process, never
  through a host process;
- clients that start it at once start one process; it exits when idle, not while a
  lease is held; its socket is mode 0600, and a socket path longer than
  ``sun_path`` works;
- a bad ``process=`` value or any other query parameter is refused in one line,
  nothing created.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stockade
from stockade.coordinators.http._async.host import AsyncHostClient
from stockade.coordinators.http._sync.host import HostClient
from stockade.coordinators.sqlite import _host
from stockade.core.errors import BackendUnavailable, InvalidArgument, LockTimeout

GONE_TIMEOUT_S = 30.0


def _url(file: Path, process: str = "") -> str:
    """``sqlite:///FILE``, the default (the host process), or with ``?process=PROCESS`` written out."""
    return f"sqlite:///{file}?process={process}" if process else f"sqlite:///{file}"


def _host_pid(file: Path) -> int | None:
    """The pid of the process listening on ``file``'s socket (its peer credentials), None if none answers."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        with _address(_host.socket_path(file)) as address:
            sock.connect(address)
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    except OSError:
        return None
    finally:
        sock.close()


def _address(path: Path):  # type: ignore[no-untyped-def]
    from stockade.transport.io import unix_address

    return unix_address(str(path))


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while Path(f"/proc/{pid}").exists():  # reaped by the client that started it (its reaper thread)
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.01)


def _stop(file: Path) -> None:
    pid = _host_pid(file)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid)


@pytest.fixture
def coord_file(tmp_path: Path):  # type: ignore[no-untyped-def]
    file = tmp_path / "coord.db"
    yield file
    _stop(file)


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> float:
    """Host processes started by this test exit after 0.5 s idle (the default is 30 s)."""
    monkeypatch.setattr(_host, "IDLE_EXIT_S", 0.5)
    return 0.5


def _cycles(url: str, scopes: list[str], rounds: int = 3) -> list[tuple[str, int]]:
    tokens = []
    with stockade.connect(url) as coord:
        for _ in range(rounds):
            for scope in scopes:
                lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=2_000, keepalive=False)
                tokens.append((scope, lease.token.value))
                lease.release()
    return tokens


def _wait_idle_exit(file: Path) -> None:
    pid = _host_pid(file)
    if pid is not None:
        _wait_gone(pid)


def test_tokens_keep_rising_across_embedded_host_embedded_host(coord_file: Path, quick_idle: float) -> None:
    scopes = ["a", "b", "c"]
    phases = []
    for process in ("embedded", "", "embedded", "host"):
        phases.append(_cycles(_url(coord_file, process), scopes))
        if process != "embedded":
            _wait_idle_exit(coord_file)  # the file is free again for embedded processes
    last: dict[str, int] = {}
    down = 0
    for tokens in phases:
        for scope, value in tokens:
            down += value <= last.get(scope, 0)
            last[scope] = value
    total = sum(len(t) for t in phases)
    print(f"tokens at or below the scope's previous one, across embedded/host/embedded/host: {down} of {total}")
    assert down == 0 and total == 36


def test_the_file_has_one_writer_kind_at_a_time(coord_file: Path) -> None:
    with stockade.connect(_url(coord_file)) as coord:
        coord.acquire("x", ttl_ms=2_000, keepalive=False).release()
        with pytest.raises(BackendUnavailable, match=r"without \?process=embedded"):
            stockade.connect(_url(coord_file, "embedded"))
    _stop(coord_file)
    log = (_host.host_dir(coord_file) / "log").read_text()
    with stockade.connect(_url(coord_file, "embedded")):  # an embedded process has the file open
        for url in (_url(coord_file), _url(coord_file, "host")):
            with pytest.raises(BackendUnavailable, match=r"add \?process=embedded") as caught:
                stockade.connect(url)
            assert "\n" not in str(caught.value) and caught.value.certain_no_effect
    assert _host_pid(coord_file) is None
    assert (_host.host_dir(coord_file) / "log").read_text() == log  # refused before a process was started


def _kill_9_round(file: Path) -> dict[str, object]:
    url = _url(file)
    coord = stockade.connect(url)
    held = {s: coord.acquire(s, ttl_ms=60_000, keepalive=False) for s in ("h0", "h1", "h2")}
    released = {s: coord.acquire(s, ttl_ms=60_000, keepalive=False) for s in ("r0", "r1")}
    for lease in released.values():
        lease.release()
    coord.acquire("after", ttl_ms=60_000, keepalive=False)  # its commit has the releases before it (C3)
    pid = _host_pid(file)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    out: dict[str, object] = {"killed": pid}
    try:
        after = coord.acquire("r0", ttl_ms=60_000, wait_ms=0, keepalive=False)  # the same client, next call
    except BackendUnavailable as exc:
        out["next_call"] = f"BackendUnavailable: {exc}"
        coord.close()
        return out
    out["next_call"] = "granted"
    out["restarted"] = _host_pid(file)
    out["above"] = after.token.value > released["r0"].token.value
    with stockade.connect(url) as other:
        infos = {s: other.inspect(s) for s in [*held, *released]}
        out["held_kept"] = sum(infos[s].token is not None and infos[s].token.value == held[s].token.value
                               for s in held)
        out["released_kept"] = sum(infos[s].token is None and infos[s].last_token >= released[s].token.value
                                   for s in ("r1",))
        try:
            other.acquire("h0", ttl_ms=1_000, wait_ms=0, keepalive=False)
            out["held_refused"] = False
        except LockTimeout:
            out["held_refused"] = True  # C3: held a full TTL from the restart
    coord.close()
    return out


def test_a_host_process_killed_9_loses_nothing_committed_and_the_next_call_restarts_it(coord_file: Path) -> None:
    out = _kill_9_round(coord_file)
    print(f"kill -9 of the host process: {out}")
    assert out["next_call"] == "granted", out
    assert out["restarted"] not in (None, out["killed"]), out
    assert out["above"] and out["held_kept"] == 3 and out["released_kept"] == 1 and out["held_refused"], out


def test_control_a_client_that_does_not_start_the_process_fails_after_the_kill(
    coord_file: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    stockade.connect(_url(coord_file)).close()  # started by a client that does
    monkeypatch.setattr(HostClient, "starts_process", False)
    monkeypatch.setattr(AsyncHostClient, "starts_process", False)
    out = _kill_9_round(coord_file)
    print(f"control, kill -9 and no start: {out}")
    assert str(out["next_call"]).startswith("BackendUnavailable"), out


_STARTER = """
import json, socket, struct, sys
import stockade
url, scope = sys.argv[1], sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()
with stockade.connect(url) as coord:
    coord.acquire(scope, ttl_ms=2000, keepalive=False).release()
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[3])
    pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    print(json.dumps({"cluster": coord.cluster_id, "pid": pid}), flush=True)
"""


def test_clients_starting_it_at_once_start_one_process(coord_file: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_STARTER), _url(coord_file), f"s{i}",
                               str(_host.socket_path(coord_file))],
                              text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(6)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # let go together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seen = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            seen.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    log = (_host.host_dir(coord_file) / "log").read_text()
    print(f"6 clients at once: host processes {len({s['pid'] for s in seen})}, clusters "
          f"{len({s['cluster'] for s in seen})}, started {log.count('listening on')}")
    assert len({s["pid"] for s in seen}) == 1 and len({s["cluster"] for s in seen}) == 1
    assert log.count("listening on") == 1, log


def test_it_exits_when_idle_and_not_while_a_lease_is_held(coord_file: Path, quick_idle: float) -> None:
    with stockade.connect(_url(coord_file)) as coord:
        lease = coord.acquire("held", ttl_ms=10_000)  # keepalive on; 10 s: a renewal late at load cannot lose it
        pid = _host_pid(coord_file)
        assert pid is not None
        time.sleep(3 * quick_idle + 1.0)
        assert _host_pid(coord_file) == pid and not lease.lost  # held: it stays
        lease.release()
    _wait_gone(pid)  # no lease, no waiter, no connection: it exits
    assert not _host.socket_path(coord_file).exists()
    with stockade.connect(_url(coord_file)) as coord:  # the next client starts a new one
        assert coord.acquire("held", ttl_ms=1_000, wait_ms=0, keepalive=False).token is not None
    assert _host_pid(coord_file) not in (None, pid)


def test_its_socket_is_the_owners_and_a_long_path_works(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    file = deep / "coord.db"
    assert len(str(_host.socket_path(file))) > 108  # longer than sun_path
    try:
        with stockade.connect(_url(file)) as coord:
            coord.acquire("x", ttl_ms=1_000, keepalive=False).release()
        mode = stat.S_IMODE(os.stat(_host.socket_path(file)).st_mode)
        assert mode == 0o600, oct(mode)
        assert stat.S_IMODE(os.stat(_host.host_dir(file)).st_mode) == 0o700
    finally:
        _stop(file)


def test_the_async_client_reaches_it_inside_a_loop(coord_file: Path) -> None:
    async def main() -> int:
        async with stockade.connect_async(_url(coord_file)) as coord:
            lease = await coord.acquire("a", ttl_ms=1_000, keepalive=False)
            await lease.release()
            return lease.token.value

    assert asyncio.run(main()) > 0


@pytest.mark.parametrize("query, says", [
    ("?process=hots", "must be host or embedded"),
    ("?procss=host", "takes no query parameter"),
    ("?process=host&process=host", "given twice"),
    ("?process=", "must be host or embedded"),
])
def test_a_bad_query_is_refused_in_one_line_and_creates_nothing(tmp_path: Path, query: str, says: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}{query}")
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_lock_delay_is_the_host_processes_own(coord_file: Path) -> None:
    for url in (_url(coord_file), _url(coord_file, "host")):
        with pytest.raises(InvalidArgument, match=r"lock_delay_ms.*add \?process=embedded"):
            stockade.connect(url, lock_delay_ms=100)
    assert list(coord_file.parent.iterdir()) == []
    with stockade.connect(_url(coord_file, "embedded"), lock_delay_ms=100) as coord:  # taken there
        assert coord.acquire("a", ttl_ms=1_000, keepalive=False).token.value > 0


def test_process_embedded_is_the_plain_embedded_coordinator(coord_file: Path) -> None:
    with stockade.connect(_url(coord_file, "embedded")) as coord:
        coord.acquire("a", ttl_ms=1_000, keepalive=False).release()
    assert coord_file.is_file() and not _host.socket_path(coord_file).exists()


def test_the_command_line_takes_the_url(coord_file: Path) -> None:
    """``stockade lock`` and ``stockade status`` name the file, not ``coord.db?process=host``."""
    env = dict(os.environ)
    url = _url(coord_file)
    ran = subprocess.run([sys.executable, "-m", "stockade", "lock", "--url", url, "--ttl-ms", "5000", "job", "--",
                          sys.executable, "-c", "import os; print(os.environ['STOCKADE_DATA'])"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[0] == str(coord_file.parent)
    status = subprocess.run([sys.executable, "-m", "stockade", "status", "--url", url], capture_output=True, text=True,
                            env=env, timeout=120)
    assert status.returncode == 0 and "job" in status.stdout, status.stderr


_FROZEN_EMBEDDED = """
import os, signal, sys
import stockade
coord = stockade.connect(sys.argv[1])
coord.acquire("held", ttl_ms=60_000, keepalive=False)
print("holding", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_default_url_beside_a_frozen_embedded_process_is_refused_at_once(coord_file: Path) -> None:
    """A process that opened the file embedded (``?process=embedded``, or an older version's default) and froze:
    the default url names ``?process=embedded`` in one line while that process is still frozen (no wait on it)."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_FROZEN_EMBEDDED), _url(coord_file, "embedded")],
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while _state(holder.pid) != "T":
            assert time.monotonic() < deadline, "the holder did not stop"
            time.sleep(0.01)
        with pytest.raises(BackendUnavailable, match=r"open in other processes.*add \?process=embedded") as caught:
            stockade.connect(_url(coord_file))
        assert _state(holder.pid) == "T"  # answered while the holder stayed frozen
        assert "\n" not in str(caught.value) and caught.value.certain_no_effect
        assert _host_pid(coord_file) is None
    finally:
        holder.kill()
        holder.wait()


def test_serve_coordinator_owns_the_file_in_its_own_process(coord_file: Path, serve: Callable[..., Any]) -> None:
    """``stockade serve --coordinator sqlite:///F`` (no query) is F's one user itself: no host process is started,
    and an embedded process may open F beside it (a host process would hold it exclusively)."""
    stockade.connect(_url(coord_file, "embedded")).close()  # the file exists
    server = serve("--coordinator", _url(coord_file))
    with stockade.connect(server.url) as client:
        token = client.acquire("via-server", ttl_ms=5_000, keepalive=False).token.value
    assert not _host.socket_path(coord_file).exists() and not _host.host_dir(coord_file).exists()
    with stockade.connect(_url(coord_file, "embedded")) as beside:
        assert beside.inspect("via-server").token.value == token


def test_the_default_is_host_and_a_server_pins_embedded_only_where_the_url_is_silent() -> None:
    from stockade.coordinators.registry import COORDINATORS

    sqlite = COORDINATORS["sqlite"]
    assert sqlite.url_query("/coord.db")[1] == {"process": "host"}
    assert sqlite.query_port({"process": "host"}) is not None and sqlite.query_port({"process": "embedded"}) is None
    pinned = {url: sqlite.with_default(url, "process", "embedded") for url in (
        "sqlite:///a.db", "sqlite:///a.db?", "sqlite:///a.db?process=host", "sqlite:///a.db?process=embedded")}
    assert pinned == {"sqlite:///a.db": "sqlite:///a.db?process=embedded",
                      "sqlite:///a.db?": "sqlite:///a.db?process=embedded",
                      "sqlite:///a.db?process=host": "sqlite:///a.db?process=host",
                      "sqlite:///a.db?process=embedded": "sqlite:///a.db?process=embedded"}


def test_an_idle_host_process_whose_directory_was_removed_exits_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A temporary directory removed under a running host process: it exits at its next idle check (within
    1 s), long before its idle exit (20 s here), and the directory stays gone (an idle exit takes the start
    lock in ``coord.db.host/``, which makes the directory anew: what the code before this check did)."""
    import shutil

    monkeypatch.setattr(_host, "IDLE_EXIT_S", 20.0)
    directory = tmp_path / "temporary"
    file = directory / "coord.db"
    with stockade.connect(_url(file)) as coord:
        coord.acquire("a", ttl_ms=1_000, keepalive=False).release()
    pid = _host_pid(file)
    assert pid is not None
    shutil.rmtree(directory)
    deadline = time.monotonic() + 10.0  # half its idle exit: gone for the removed directory, not for idleness
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.01)
    assert not directory.exists()


def test_a_relative_pythonpath_of_the_client_is_made_absolute_for_the_host_process(coord_file: Path) -> None:
    """The process runs in the file's directory: a client's ``PYTHONPATH=src`` (relative to the client's working
    directory) reaches it as an absolute path, so it imports the client's stockade, not another one or none."""
    src = Path(stockade.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.path.relpath(src, src.parent))
    ran = subprocess.run([sys.executable, "-c", "import sys, stockade; stockade.connect(sys.argv[1]).close()",
                          _url(coord_file)], cwd=src.parent, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    pid = _host_pid(coord_file)
    assert pid is not None
    entries = Path(f"/proc/{pid}/environ").read_text().split("\0")
    environ = dict(entry.split("=", 1) for entry in entries if "=" in entry)
    assert environ["PYTHONPATH"] == str(src)
