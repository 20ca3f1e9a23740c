"""The dashboard's API under ``/ui/`` (docs/dashboard.md) against real ``stockade serve`` processes.

What a browser gets and what it must not: sessions (cookie flags, tampering,
scopes), no lease id and no token MAC in any answer or event, snapshots that
follow a change within a second (judged by the events' order: the first one
after the grant shows it), the bounds (open streams, a slow reader's unsent
bytes, pages), busiest scopes first. Each safety check also runs against a
control from tests/helpers/dashboard_controls.py that must fail it.
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import BACKENDS, HELPERS

sys.path.insert(0, str(HELPERS))
from server_fixtures import PYTHON, ServerProcess, _env, request, start_server  # noqa: E402

from stockade.coordinators.registry import COORDINATORS  # noqa: E402
from stockade.core.journal import HistoryEvent  # noqa: E402
from stockade.testing.servers import reaper  # noqa: E402
from stockade.timeline import CSS as TIMELINE_CSS  # noqa: E402
from stockade.timeline import journal_events, render_fragment  # noqa: E402

ADMIN = "dashboard-admin-token-0123456789"
SCOPED = "dashboard-reports-token-012345678"
BEARER = {"Authorization": f"Bearer {ADMIN}"}


def _serve(tmp_path: Path, *args: str, control: str | None = None, auth: bool = True) -> ServerProcess:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN}\n{SCOPED} reports.*\n")
    extra = ("--auth-tokens", str(tokens), *args) if auth else args
    return start_server(tmp_path / "data", *extra, control=control, controls="dashboard_controls.py")


def _acquire(url: str, scope: str, holder: str = "h", wait_ms: int = 0) -> dict:
    status, _, body = request(url, "POST", f"/v1/locks/{scope}/acquire",
                              json_body={"ttl_ms": 60_000, "holder": holder, "wait_ms": wait_ms}, headers=BEARER)
    assert status == 200, body
    return json.loads(body)


def _login(url: str, token: str) -> str:
    status, headers, body = request(url, "POST", "/ui/session", headers={"Authorization": f"Bearer {token}"})
    assert status == 204, body
    return headers["set-cookie"].split(";")[0]


class EventStream:
    """A raw ``GET /ui/events`` reader: frames in order, each read with a deadline."""

    def __init__(self, url: str, headers: dict[str, str], query: str = "", rcvbuf: int | None = None) -> None:
        host, port = url.rsplit("/", 1)[1].split(":")
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, int(port)))
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(f"GET /ui/events{query} HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode())
        self.buffer = b""
        self.head = b""

    def status(self, timeout_s: float = 10) -> int:
        while b"\r\n\r\n" not in self.buffer:
            self._read(time.monotonic() + timeout_s)
        self.head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        return int(self.head.split()[1])

    def _read(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            raise TimeoutError("no event before the deadline")
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("stream closed")
        self.buffer += data

    def snapshot(self, timeout_s: float = 10) -> dict:
        """The next snapshot event's document."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n\n" not in self.buffer:
                self._read(deadline)
            frame, _, self.buffer = self.buffer.partition(b"\n\n")
            fields = dict(line.split(": ", 1) for line in frame.decode().split("\n") if ": " in line)
            if fields.get("event") == "snapshot":
                return json.loads(fields["data"])

    def close(self) -> None:
        self.sock.close()


# -- sessions and secrets ---------------------------------------------------------------------------


def test_a_session_cookie_is_httponly_strict_expiring_and_limited_to_its_token(tmp_path: Path) -> None:
    server = _serve(tmp_path)
    try:
        for scope in ("billing", "reports.daily"):
            _acquire(server.url, scope)
        assert request(server.url, "GET", "/ui/api/state")[0] == 401
        status, headers, _ = request(server.url, "POST", "/ui/session", headers={"Authorization": f"Bearer {ADMIN}"})
        flags = headers["set-cookie"].split("; ")
        assert status == 204 and {"HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=28800"} <= set(flags)
        cookie = flags[0]
        state = json.loads(request(server.url, "GET", "/ui/api/state", headers={"Cookie": cookie})[2])
        assert [row["scope"] for row in state["scopes"]] == ["billing", "reports.daily"] and "health" in state
        # The cookie is the dashboard's only: the API still wants its bearer token.
        assert request(server.url, "GET", "/v1/locks", headers={"Cookie": cookie})[0] == 401
        # Tampered, made up, or for an unknown token: refused.
        expires, who, mac = cookie.split("=", 1)[1].split(".")
        other = "B" if mac[-1] == "A" else "A"  # a last character that differs (it was "A" in 1 run of 64)
        for forged in (f"{int(expires) + 1}.{who}.{mac}", f"{expires}.{who}.{mac[:-1]}{other}", "1.2.3"):
            assert request(server.url, "GET", "/ui/api/state",
                           headers={"Cookie": f"stockade_session={forged}"})[0] == 401, forged
        assert request(server.url, "POST", "/ui/session", headers={"Authorization": "Bearer nope-0123456789abcdef"}
                       )[0] == 401
        # A scope-limited token's session sees its scopes, and neither the health nor the rejection counts.
        limited = _login(server.url, SCOPED)
        state = json.loads(request(server.url, "GET", "/ui/api/state", headers={"Cookie": limited})[2])
        assert [row["scope"] for row in state["scopes"]] == ["reports.daily"]
        assert "health" not in state and "rejections" not in state and state["limited"] is True
        assert request(server.url, "GET", "/ui/api/timeline/billing", headers={"Cookie": limited})[0] == 403
        assert request(server.url, "GET", "/ui/api/timeline/reports.daily", headers={"Cookie": limited})[0] == 200
        # No write: only GET on the data, and logging out ends the session.
        for method in ("POST", "PUT", "DELETE"):
            assert request(server.url, method, "/ui/api/state", headers={"Cookie": cookie})[0] == 405
        assert request(server.url, "DELETE", "/ui/session", headers={"Cookie": cookie})[0] == 204
        assert request(server.url, "GET", "/ui/api/state", headers={"Cookie": cookie})[0] == 401
    finally:
        server.stop()


@pytest.mark.parametrize("control", [None, "forgets-logouts"])
def test_a_logout_ends_the_tokens_sessions_and_outlives_a_restart(tmp_path: Path, control: str | None) -> None:
    """Logged out, a cookie (and every cookie of its token opened before) stays refused after a restart."""
    server = _serve(tmp_path, control=control)
    try:
        first, second, other = _login(server.url, ADMIN), _login(server.url, ADMIN), _login(server.url, SCOPED)
        assert request(server.url, "DELETE", "/ui/session", headers={"Cookie": first})[0] == 204
    finally:
        server.stop()
    server = _serve(tmp_path, control=control)
    try:
        seen = {name: request(server.url, "GET", "/ui/api/state", headers={"Cookie": cookie})[0]
                for name, cookie in (("first", first), ("second", second), ("other token", other))}
        again = _login(server.url, ADMIN)  # a new login after the logout works, in the same second too
        seen["new login"] = request(server.url, "GET", "/ui/api/state", headers={"Cookie": again})[0]
    finally:
        server.stop()
    if control is None:
        assert seen == {"first": 401, "second": 401, "other token": 200, "new login": 200}, seen
    else:  # the control: logouts kept in memory, lost with the process
        assert seen["first"] == 200 and seen["second"] == 200, seen


def test_a_damaged_logouts_file_is_one_line_at_start(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dashboard.logouts").write_text("{not json")
    (tmp_path / "tokens").write_text(f"{ADMIN}\n")
    done = subprocess.run([PYTHON, "-m", "stockade", "serve", "--data-dir", str(tmp_path / "data"), "--port", "0",
                           "--auth-tokens", str(tmp_path / "tokens")], env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "is not a logouts file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_control_a_session_that_ignores_its_scopes_is_caught(tmp_path: Path) -> None:
    server = _serve(tmp_path, control="sees-every-scope")
    try:
        for scope in ("billing", "reports.daily"):
            _acquire(server.url, scope)
        limited = _login(server.url, SCOPED)
        state = json.loads(request(server.url, "GET", "/ui/api/state", headers={"Cookie": limited})[2])
        assert [row["scope"] for row in state["scopes"]] == ["billing", "reports.daily"]  # the leak the test catches
    finally:
        server.stop()


def _bad_cookies(good: str) -> dict[str, str]:
    """Cookies a hostile client sends: huge, malformed, of another name, made up from a good one."""
    expires, who, mac = good.split("=", 1)[1].split(".")
    return {
        "huge (12 KiB)": "stockade_session=" + "A" * 12 * 1024,
        "past the header bound (20 KiB)": "stockade_session=" + "A" * 20 * 1024,
        "empty": "stockade_session=", "no dots": "stockade_session=abc", "dots only": "stockade_session=..",
        "latin-1 bytes": "stockade_session=\u00e9\u00e9.\u00fc.\u00f6",
        "another name": f"session={expires}.{who}.{mac}",
        "a field too many": f"{good}.{mac}", "expired": f"stockade_session=0.{who}.{mac}",
        "a digit the key did not sign": f"stockade_session={expires}9.{who}.{mac}",
        "another token's name": f"stockade_session={expires}.{mac[:len(who)]}.{mac}",
        "forged first, good second": f"stockade_session=1.2.3; {good}",
    }


def _admin_view(server: ServerProcess) -> tuple[list[tuple[str, str, str]], bytes | None]:
    """What a hostile request must not change: the leases (read with the bearer token) and the kept logouts."""
    state = json.loads(request(server.url, "GET", "/ui/api/state", headers=BEARER)[2])
    logouts = server.data_dir / "dashboard.logouts"
    return ([(r["scope"], r["holder"], r["token"]) for r in state["scopes"]],
            logouts.read_bytes() if logouts.exists() else None)


def _refused(server: ServerProcess, cookie: str) -> dict[str, int]:
    """The status of each dashboard request made with ``cookie`` alone (the data, the stream, a timeline, a
    logout); the stream is asked with urllib, so an accepted one would hang the test until its timeout."""
    return {f"{method} {path}": request(server.url, method, path, headers={"Cookie": cookie}, timeout=10)[0]
            for method, path in (("GET", "/ui/api/state"), ("GET", "/ui/events"), ("GET", "/ui/api/timeline/billing"),
                                 ("DELETE", "/ui/session"))}


def test_a_hostile_client_gets_a_4xx_and_changes_nothing(tmp_path: Path) -> None:
    """Bad cookies, a cookie replayed after its logout and after a restart, a limited token asking for another
    scope: each a 4xx, and neither the leases nor the kept logouts nor another session change."""
    server = _serve(tmp_path)
    try:
        for scope in ("billing", "reports.daily"):
            _acquire(server.url, scope)
        good, limited = _login(server.url, ADMIN), _login(server.url, SCOPED)
        before = _admin_view(server)
        answers = {name: _refused(server, cookie) for name, cookie in _bad_cookies(good).items()}
        print("\n" + "\n".join(f"{name}: {sorted(set(seen.values()))}" for name, seen in answers.items()))
        assert {name: {s for s in seen.values() if not 400 <= s < 500} for name, seen in answers.items()} == {
            name: set() for name in answers}
        assert set(answers["past the header bound (20 KiB)"].values()) == {431}
        assert set(answers["huge (12 KiB)"].values()) == {401}
        # A scope-limited session asks for another scope: 403 for its timeline, nothing of it in the data.
        assert request(server.url, "GET", "/ui/api/timeline/billing", headers={"Cookie": limited})[0] == 403
        assert request(server.url, "GET", "/ui/api/timeline/billing",
                       headers={"Authorization": f"Bearer {SCOPED}"})[0] == 403
        state = json.loads(request(server.url, "GET", "/ui/api/state?q=billing", headers={"Cookie": limited})[2])
        assert (state["scopes"], state["scopes_seen"]) == ([], 0)
        stream = EventStream(server.url, {"Cookie": limited}, "?q=billing")
        try:
            assert stream.status() == 200 and stream.snapshot()["scopes"] == []
        finally:
            stream.close()
        assert _admin_view(server) == before
        # A cookie replayed after its logout, then after a restart: refused, and its logout is not redone.
        assert request(server.url, "DELETE", "/ui/session", headers={"Cookie": good})[0] == 204
        logged_out = _admin_view(server)
        assert logged_out[1] is not None and logged_out[1] != before[1]
        assert set(_refused(server, good).values()) == {401}
        assert _admin_view(server) == logged_out
    finally:
        server.stop()
    server = _serve(tmp_path)
    try:
        assert set(_refused(server, good).values()) == {401}
        assert _admin_view(server) == logged_out
        assert request(server.url, "GET", "/ui/api/state", headers={"Cookie": limited})[0] == 200  # untouched
    finally:
        server.stop()


def _answers(server: ServerProcess, cookie: str) -> list[bytes]:
    """Every page, file, document and a few events the dashboard serves for what ``_grants`` made."""
    headers = {"Cookie": cookie}
    paths = ["/ui/", "/ui/scope/billing", "/ui/static/dashboard.js", "/ui/static/dashboard.css", "/ui/api/session",
             "/ui/api/state", "/ui/api/state?q=bill", "/ui/api/timeline/billing", "/ui/api/timeline/payroll"]
    answers = [request(server.url, "GET", path, headers=headers)[2] for path in paths]
    stream = EventStream(server.url, headers)
    try:
        assert stream.status() == 200
        answers.append(stream.head)
        _acquire(server.url, "late")  # one more change, so that the stream sends a second snapshot
        for _ in range(2):
            answers.append(json.dumps(stream.snapshot()).encode())
    finally:
        stream.close()
    return answers


def _grants(server: ServerProcess) -> list[dict]:
    grants = [_acquire(server.url, "billing", "alice")]
    assert request(server.url, "DELETE", f"/v1/leases/{grants[0]['lease_id']}", headers=BEARER)[0] == 204
    grants.append(_acquire(server.url, "billing", "bob"))
    for grant, status in ((grants[1], 200), (grants[0], 409)):  # a stale write: on the timeline, with its token
        assert request(server.url, "PUT", "/v1/kv/billing/k", body=b"v",
                       headers={**BEARER, "Fencing-Token": grant["token"]})[0] == status
    grants.append(_acquire(server.url, "payroll", "carol"))
    return grants


def _leaks(answers: list[bytes], grants: list[dict]) -> list[str]:
    secrets = [g["lease_id"] for g in grants] + [g["token"] for g in grants] + [g["token"].split(".")[4]
                                                                                for g in grants] + [ADMIN, SCOPED]
    return [secret for secret in secrets for answer in answers if secret.encode() in answer]


@pytest.mark.parametrize("control", [None, "leaks-lease-id"])
def test_no_page_or_event_carries_a_lease_id_or_a_token_mac(tmp_path: Path, control: str | None) -> None:
    server = _serve(tmp_path, control=control)
    try:
        grants = _grants(server)
        answers = _answers(server, _login(server.url, ADMIN))
        leaks = _leaks(answers, grants)
        assert sum(b"refused" in a or b"stale" in a for a in answers) >= 1  # the timeline was drawn
        if control is None:
            assert leaks == [], leaks
        else:
            assert leaks, "the control's lease ids went unnoticed"
    finally:
        server.stop()


# -- live updates and their bounds ------------------------------------------------------------------


def test_an_event_follows_a_grant_within_a_second_and_streams_are_capped(tmp_path: Path) -> None:
    server = _serve(tmp_path, "--dashboard-streams-max", "2", auth=False)
    streams = []
    try:
        for _ in range(2):
            streams.append(EventStream(server.url, {}))
            assert streams[-1].status() == 200
            streams[-1].snapshot()
        refused = EventStream(server.url, {})
        assert refused.status() == 503 and b"Retry-After: 1" in refused.head
        refused.close()
        delays = []
        for index in range(5):
            _acquire(server.url, f"scope-{index}")
            started = time.monotonic()
            document = streams[0].snapshot(timeout_s=1.0)  # the next event already shows the grant
            delays.append(time.monotonic() - started)
            assert f"scope-{index}" in [row["scope"] for row in document["scopes"]]
        print(f"events {', '.join(f'{d * 1000:.0f}' for d in delays)} ms after the grant's answer")
        streams.pop(0).close()
        deadline = time.monotonic() + 10
        while True:  # the closed stream leaves the count once the server sees the close
            again = EventStream(server.url, {})
            if again.status() == 200:
                break
            again.close()
            assert time.monotonic() < deadline
        streams.append(again)
    finally:
        for stream in streams:
            stream.close()
        server.stop()


def _health(server: ServerProcess) -> dict:
    return json.loads(request(server.url, "GET", "/ui/api/state")[2])["health"]


@pytest.mark.parametrize("control", ["small-stream-buffer", "unbounded-stream"])
def test_a_slow_reader_is_dropped_not_buffered(tmp_path: Path, control: str) -> None:
    """A stream nobody reads: with a bound (16 KiB here), dropped; the control keeps buffering past 256 KiB."""
    server = _serve(tmp_path, control=control, auth=False)
    slow = EventStream(server.url, {}, rcvbuf=1024)
    try:
        for index in range(50):  # 50 rows of 190-byte names: each snapshot is ~17 KB
            _acquire(server.url, f"{'x' * 180}.{index}")
        cycles, deadline = 0, time.monotonic() + 120
        while time.monotonic() < deadline:  # every cycle is a change; a snapshot goes out every 250 ms at most
            grant = _acquire(server.url, "cycle")
            request(server.url, "DELETE", f"/v1/leases/{grant['lease_id']}", headers=BEARER)
            cycles += 1
            health = _health(server)
            if health["streams_dropped"] or health["stream_backlog_bytes"] > 256 * 1024:
                break
        print(f"{control}: after {cycles} cycles: {health}")
        if control == "small-stream-buffer":
            assert health["streams_dropped"] == 1 and health["streams"] == 0
        else:
            assert health["streams_dropped"] == 0 and health["stream_backlog_bytes"] > 256 * 1024
    finally:
        slow.close()
        server.stop()


# -- what is shown --------------------------------------------------------------------------------


def test_busiest_scopes_first_in_pages_and_the_filter(tmp_path: Path) -> None:
    server = _serve(tmp_path, auth=False)
    try:
        for index in range(120):
            _acquire(server.url, f"job.{index:03d}")
        waiting = []
        for holder in ("w1", "w2"):  # two waiters in line on job.077: the busiest scope
            proc = subprocess.Popen([PYTHON, "-c", (
                "import json, urllib.request; urllib.request.urlopen(urllib.request.Request("
                f"'{server.url}/v1/locks/job.077/acquire', data=json.dumps({{'ttl_ms': 1000, 'holder': '{holder}', "
                "'wait_ms': 20000}).encode(), headers={'Content-Type': 'application/json'}), timeout=30)")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            reaper.watch(proc.pid)
            waiting.append(proc)
            deadline = time.monotonic() + 10
            while len(json.loads(request(server.url, "GET", "/ui/api/state")[2])["scopes"][0]["queue"] or ()) < len(
                    waiting):
                assert time.monotonic() < deadline
        first = json.loads(request(server.url, "GET", "/ui/api/state")[2])
        assert first["scopes_seen"] == 120 and first["pages"] == 3 and len(first["scopes"]) == 50
        assert first["scopes"][0]["scope"] == "job.077" and first["scopes"][0]["queue"] == ["w1", "w2"]
        last = json.loads(request(server.url, "GET", "/ui/api/state?page=2")[2])
        assert len(last["scopes"]) == 20
        shown = {row["scope"] for page in range(3) for row in json.loads(
            request(server.url, "GET", f"/ui/api/state?page={page}")[2])["scopes"]}
        assert len(shown) == 120
        found = json.loads(request(server.url, "GET", "/ui/api/state?q=.11")[2])
        assert sorted(row["scope"] for row in found["scopes"]) == [f"job.{i}" for i in range(110, 120)]
        # A scope's page asks for its scope by name: found however many busier scopes contain the name.
        grant = _acquire(server.url, "job")
        assert request(server.url, "DELETE", f"/v1/leases/{grant['lease_id']}")[0] == 204
        by_filter = json.loads(request(server.url, "GET", "/ui/api/state?q=job")[2])
        assert by_filter["scopes_seen"] == 121 and "job" not in [row["scope"] for row in by_filter["scopes"]]
        by_name = json.loads(request(server.url, "GET", "/ui/api/state?scope=job")[2])
        assert [(row["scope"], row["state"]) for row in by_name["scopes"]] == [("job", "free")]
        assert json.loads(request(server.url, "GET", "/ui/api/state?scope=jo")[2])["scopes"] == []
        for bad in ("page=200", "page=-1", "q=" + "x" * 201, "other=1", "scope=..", "scope=job&page=0", "scope="):
            assert request(server.url, "GET", f"/ui/api/state?{bad}")[0] == 400, bad
        for proc in waiting:
            proc.kill()
            proc.wait(10)
    finally:
        server.stop()


def test_the_timeline_escapes_names_and_shows_both_tokens_of_a_refusal() -> None:
    events = [
        (HistoryEvent(1, "s", "grant", "<b>eve</b>", 7, 1_000), "coordinator"),
        (HistoryEvent(2, "s", "expire", "<b>eve</b>", 7, 2_000), "coordinator"),
        (HistoryEvent(3, "s", "grant", "bob", 8, 2_500), "coordinator"),
        (HistoryEvent(1, "s", "reject", "", 7, 3_000, "stale, high-water 8"), "store"),
    ]
    page = render_fragment(journal_events(events), until_ms=4_000, wall_clock=True)
    assert "<b>" not in page and "&lt;b&gt;eve&lt;/b&gt;" in page
    assert page.count('class="lease"') == 2 and page.count('class="end expire"') == 1
    assert "7 &lt; 8" in page and "stale, high-water 8" in page  # the refused token and the mark
    assert "style=" not in page and "<style" not in page and "<script" not in page  # the dashboard's CSP
    assert "No events" in render_fragment([], empty="No events recorded for s.")


def _drawn(fragment: str) -> Counter[tuple[str, str, str]]:
    """What a timeline drew: each SVG marker ``(class, kind, token)`` and each table row ``(row, kind, token)``."""
    markers = re.findall(r'<(?:g|rect) class="([^"]*)" data-kind="([^"]*)"(?: data-token="(\d*)")?', fragment)
    rows = re.findall(r'<tr class="([^"]*)"><td>[^<]*</td><td>[^<]*</td><td class="kind">([^<]*)</td>'
                      r'<td class="num">(\d*)</td>', fragment)
    return Counter(markers) + Counter(("row " + c, k, t) for c, k, t in rows)


def _scope_page_and_history(tmp_path: Path, control: str | None) -> tuple[str, str, dict[str, int]]:
    """One scope's grant, expiry, release and refusal; its dashboard timeline and its ``stockade history --html``."""
    server = _serve(tmp_path, control=control, auth=False)
    try:
        scope = "same.events"
        first = json.loads(request(server.url, "POST", f"/v1/locks/{scope}/acquire",
                                   json_body={"ttl_ms": 200, "holder": "ann", "wait_ms": 0})[2])
        second = json.loads(request(server.url, "POST", f"/v1/locks/{scope}/acquire",  # after ann's lease expired
                                    json_body={"ttl_ms": 60_000, "holder": "bob", "wait_ms": 30_000})[2])
        for token, status in ((second["token"], 200), (first["token"], 409)):  # ann's late write is refused
            assert request(server.url, "PUT", f"/v1/kv/{scope}/k", body=b"v",
                           headers={"Fencing-Token": token})[0] == status
        assert request(server.url, "DELETE", f"/v1/leases/{second['lease_id']}")[0] == 204
        _acquire(server.url, scope, "carl")  # still open
        status, headers, body = request(server.url, "GET", f"/ui/api/timeline/{scope}")
        assert status == 200 and "unsafe-inline" not in headers["content-security-policy"]
        sheet = request(server.url, "GET", "/ui/static/timeline.css")  # the sheet the report files inline
        assert sheet[0] == 200 and sheet[2].decode() == TIMELINE_CSS
        page = tmp_path / "history.html"
        result = subprocess.run([PYTHON, "-m", "stockade", "history", scope, "--data-dir", str(server.data_dir),
                                 "--html", str(page)], capture_output=True, text=True, timeout=120, env=_env())
        assert result.returncode == 0, result.stderr
        return body.decode(), page.read_text(), {"ann": first["token_value"], "bob": second["token_value"]}
    finally:
        server.stop()


def test_the_scope_page_and_history_html_draw_the_same_events(tmp_path: Path) -> None:
    dashboard, history, tokens = _scope_page_and_history(tmp_path, None)
    drawn = _drawn(dashboard)
    assert drawn == _drawn(history)
    kinds = Counter(kind for _, kind, _ in drawn)
    print(f"\nthe same {sum(drawn.values())} markers and rows on both: {dict(kinds)}")
    assert kinds == {"grant": 3 * 2, "expire": 2, "release": 2, "write": 1, "write refused": 1}  # marker + row
    ann, bob = tokens["ann"], tokens["bob"]
    assert ("write refused", "write", str(ann)) in drawn  # the refused token, and the mark that refused it:
    assert f'<td class="num">{ann}</td><td class="num">{bob}</td>' in dashboard
    assert f"high-water {bob}" in dashboard and f"high-water {bob}" in history


@pytest.mark.parametrize("control", ["drops-expiries", "drops-refusals"])
def test_control_a_scope_page_that_drops_an_event_kind_differs(tmp_path: Path, control: str) -> None:
    dashboard, history, _ = _scope_page_and_history(tmp_path, control)
    missing = _drawn(history) - _drawn(dashboard)
    print(f"\ncontrol {control}: {sum(missing.values())} markers and rows of history --html not on the page")
    assert missing and not _drawn(dashboard) - _drawn(history)


# -- stockade ui: the same pages for any coordinator ------------------------------------------------


def _ui(url: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([PYTHON, "-m", "stockade", "ui", "--url", url, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env())
    reaper.watch(proc.pid)
    line = proc.stdout.readline().decode()  # type: ignore[union-attr]
    if " on http://" not in line:
        proc.kill()
        raise AssertionError(f"stockade ui did not start: {line!r} {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    return proc, line.rsplit(" ", 1)[1].strip().removesuffix("/ui/")


#: The backends another process can reach (`stockade ui` is one): all but the in-process memory engine.
OTHER_PROCESS = [name for name, schemes in BACKENDS.items()
                 if any(COORDINATORS[scheme].served or COORDINATORS[scheme].remote for scheme in schemes)]


@pytest.mark.parametrize("backend", OTHER_PROCESS, indirect=True)
def test_stockade_ui_shows_the_scope_stockade_status_shows(coord_url: str, backend: str) -> None:
    import stockade

    with stockade.connect(coord_url) as coord:
        # ZooKeeper bounds a TTL by its session (10 s here); elsewhere a long one, so a loaded machine cannot expire it.
        lease = coord.acquire("ui.scope", ttl_ms=9_000 if backend == "zookeeper" else 60_000, holder="ulla")
        try:
            status = subprocess.run([PYTHON, "-m", "stockade", "status", "--url", coord_url, "--json"],
                                    capture_output=True, text=True, env=_env(), timeout=120)
            assert status.returncode == 0, status.stderr
            shown = next(json.loads(line) for line in status.stdout.splitlines()
                         if json.loads(line)["scope"] == "ui.scope")
            proc, ui_url = _ui(coord_url)
            try:
                state = json.loads(request(ui_url, "GET", "/ui/api/state?q=ui.scope")[2])
                row = next(r for r in state["scopes"] if r["scope"] == "ui.scope")
                assert (row["state"], row["holder"], row["token"]) == (shown["state"], shown["holder"],
                                                                       str(shown["token"]))
                assert row["token"] == str(lease.token.value) and state["cluster"] == coord.cluster_id
                assert "health" not in state and "rejections" not in state
                timeline = request(ui_url, "GET", "/ui/api/timeline/ui.scope")[2].decode()
                assert str(lease.token.value) in timeline and '<tr class="grant">' in timeline
                for method in ("POST", "PUT", "DELETE"):  # read-only
                    assert request(ui_url, method, "/ui/api/state")[0] == 405
                assert request(ui_url, "GET", "/v1/locks")[0] == 404
            finally:
                proc.terminate()
                assert proc.wait(10) == 0
        finally:
            lease.release()


def test_a_views_scope_test_is_the_auth_rule() -> None:
    """`View.sees` (one C call per scope, for 100,000 scopes a snapshot) agrees with `scope_allowed` everywhere."""
    from stockade.server._auth import scope_allowed
    from stockade.server._dashboard_view import View

    names = ["", "a", "ab", "b", "bb", "q", "rss.000001", "rss.001", "reports.daily", "reports", "xreports.x"]
    for patterns in [("a*", "b"), ("rss.00*",), ("rss.000001", "q*"), ("reports.*", "b"), ("reports",)]:
        assert [View(patterns).sees(n) for n in names] == [scope_allowed(n, patterns) for n in names], patterns
    assert [View(("reports.*",), "daily").sees(n) for n in names].count(True) == 1


# -- a scope's page over a backend: read by name, past the listing's bound ---------------------------

SCAN_BOUND = 20  # the listing's bound for this test (10,000 in the package: costly to create past)


async def _backend_snapshots(leases, store, names: list[str]) -> dict[str, dict]:
    """Per name: the exact view (``?scope=``), the control, a filter by the whole name (the listing path, which
    the exact view took before), and the exact view of a viewer whose token covers ``other.*`` only."""
    from stockade.server._dashboard_view import View, snapshot

    out = {}
    for name in names:
        views = {name: View(None, name, exact=True), "q:" + name: View(None, name),
                 "limited:" + name: View(("other.*",), name, exact=True)}
        for key, view in views.items():
            out[key] = await snapshot(leases, store, view, cluster="", lock_delay_ms=None, health=None)
    return out


@pytest.mark.parametrize("via", ["ui-file", "serve-coordinator", "ui-server"])
def test_a_scope_page_over_a_backend_finds_a_scope_past_the_listings_bound(
        tmp_path: Path, via: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """bound + 5 scopes: the last one's page (``?scope=``) shows it, held by its holder, while the listing (the
    control: the old path of a scope's page) stops at the bound and misses it; a scope the viewer may not see,
    or one never recorded, shows no row."""
    import asyncio

    import stockade
    from stockade.cli import ui
    from stockade.server import _dashboard_view
    from stockade.server._port_leases import open_port_leases

    monkeypatch.setattr(_dashboard_view, "SCAN_SCOPES_MAX", SCAN_BOUND)
    monkeypatch.setattr(ui, "SCAN_SCOPES_MAX", SCAN_BOUND)
    url = request.getfixturevalue("http_server").url if via == "ui-server" else f"sqlite:///{tmp_path}/coord.db"
    names = [f"many.{index:03d}" for index in range(SCAN_BOUND + 5)]
    asked = [names[-1], names[0], "many.none"]

    async def through_the_port() -> dict[str, dict]:  # what `stockade serve --coordinator URL` reads
        leases = await open_port_leases(url, lock_delay_ms=0)
        try:
            return await _backend_snapshots(leases, marks, asked)
        finally:
            await leases.coordinator.aclose()

    # Beside the server (which opens a sqlite:/// url in its own process), this process opens the file too.
    with stockade.connect(f"{url}?process=embedded" if via == "serve-coordinator" else url) as coord:
        for name in names[:-1]:
            coord.acquire(name, ttl_ms=60_000, holder="h").release()
        last = coord.acquire(names[-1], ttl_ms=60_000, holder="late")
        marks = ui.UrlMarks(url, None)
        try:
            if via == "serve-coordinator":
                got = asyncio.run(through_the_port())
            else:  # what `stockade ui --url URL` reads
                leases = ui.UrlLeases(url)
                leases.open()
                try:
                    got = asyncio.run(_backend_snapshots(leases, marks, asked))
                finally:
                    leases.close()
        finally:
            marks.close()
            last.release()
    found = got[names[-1]]
    assert [(r["scope"], r["state"], r["holder"], r["token"]) for r in found["scopes"]] == [
        (names[-1], "held", "late", str(last.token.value))]
    assert found["exact"] and found["scopes_seen"] == 1
    control = got["q:" + names[-1]]  # the listing: the first SCAN_BOUND in name order, the last one not among them
    assert control["scopes"] == [] and not control["exact"]
    assert [r["scope"] for r in got[names[0]]["scopes"]] == [names[0]] == [
        r["scope"] for r in got["q:" + names[0]]["scopes"]]  # within the bound both paths agree
    assert got["many.none"]["scopes"] == [] and got["many.none"]["scopes_seen"] == 0
    assert all(got["limited:" + name]["scopes"] == [] for name in asked)
