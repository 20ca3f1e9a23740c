"""The dashboard (docs/dashboard.md) in a real headless Chromium, against a real ``stockade serve`` with auth on.

One browser walks through what an operator does: logs in with a token, sees a
grant made by a client appear within a second, sees a fenced-out write counted
and drawn on the scope's timeline with both tokens, keeps a live page across a
server restart, and logs in again with a scope-limited token that sees only its
scopes. Every wait is a poll of the page's DOM with a deadline, never a sleep.
The browser cannot resolve any host but 127.0.0.1, and the test checks that the
page asked nothing of another origin and logged no console error. Screenshots
go to docs/images/ when STOCKADE_SCREENSHOTS=1 (they are committed from such a run).

Each of the walk's checks is a function that the controls (tests/helpers/dashboard_controls.py: a stream
frozen after its first snapshot, a timeline without the store's refusals, a page that logs an error, a page
that does not reconnect, a session that ignores its scopes) must fail, in a browser too.

In CI (CI=true) a missing Chromium fails the test: it is never skipped there.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import HELPERS

sys.path.insert(0, str(HELPERS))
from browser import Browser, require_browser  # noqa: E402
from server_fixtures import ServerProcess, request, start_server  # noqa: E402

ADMIN = "dashboard-admin-token-0123456789"
SCOPED = "dashboard-reports-token-012345678"
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
APPEAR_S = 1.0  # the bound: a change is on the page within a second


def _acquire(url: str, scope: str, holder: str, ttl_ms: int = 60_000, wait_ms: int = 0) -> dict:
    status, _, body = request(url, "POST", f"/v1/locks/{scope}/acquire",
                              json_body={"ttl_ms": ttl_ms, "holder": holder, "wait_ms": wait_ms},
                              headers={"Authorization": f"Bearer {ADMIN}"})
    assert status == 200, body
    return json.loads(body)


def _put(url: str, scope: str, token: str) -> int:
    return request(url, "PUT", f"/v1/kv/{scope}/k", body=b"v",
                   headers={"Authorization": f"Bearer {ADMIN}", "Fencing-Token": token})[0]


def _serve(data: Path, tokens: Path, control: str | None = None, port: int = 0) -> ServerProcess:
    return start_server(data, "--auth-tokens", str(tokens), control=control, controls="dashboard_controls.py",
                        port=port)


def _grant_shown(browser: Browser, url: str, scope: str, holder: str, grants: list[dict]) -> float:
    """A client's grant; the seconds until its row is on the page (fails past APPEAR_S)."""
    grants.append(_acquire(url, scope, holder))
    started = time.monotonic()
    browser.wait_for("return !!document.querySelector(`#scopes tr[data-scope='${arguments[0]}']`)", scope,
                     timeout_s=APPEAR_S)
    return time.monotonic() - started


def _no_secrets(page: str, grants: list[dict]) -> None:
    for grant in grants:
        mac = grant["token"].split(".")[4]
        assert grant["lease_id"] not in page and grant["token"] not in page and mac not in page
    assert ADMIN not in page and SCOPED not in page


def _login(browser: Browser, token: str) -> None:
    """Log in through the page's form: it was shown, and the page is live after it."""
    browser.wait_for("return !document.getElementById('login').hidden")
    assert browser.run("return document.getElementById('board').hidden") is True
    browser.type_into("#token", token)
    browser.click("#login button[type=submit]")
    browser.wait_for("return document.getElementById('status').textContent === 'live'")
    assert "stockade_session" not in browser.run("return document.cookie")  # HttpOnly: the script cannot read it


def _fence_out(url: str, grants: list[dict]) -> tuple[dict, dict]:
    """``billing``'s lease released, a new one granted and written with, then the old token's write refused."""
    old = grants[0]
    assert request(url, "DELETE", f"/v1/leases/{old['lease_id']}", headers={"Authorization": f"Bearer {ADMIN}"}
                   )[0] == 204
    new = _acquire(url, "billing", "frank")
    grants.append(new)
    assert _put(url, "billing", new["token"]) == 200
    assert _put(url, "billing", old["token"]) == 409
    return old, new


def _refusal_on_timeline(browser: Browser, url: str, old: dict, new: dict) -> None:
    """The scope page draws the refused write with both tokens: the refused one and the mark that refused it."""
    browser.open(url + "/ui/scope/billing")
    browser.wait_for("return !!document.querySelector('#timeline table.events tr.refused')")
    refused = browser.run("return document.querySelector('#timeline table.events tr.refused').textContent")
    assert str(old["token_value"]) in refused and f"high-water {new['token_value']}" in refused, refused
    label = browser.run("return document.querySelector('#timeline svg .write.refused text.wlabel').textContent")
    assert label == f"{_short(old['token_value'])} < {_short(new['token_value'])}", label
    assert browser.run("return document.querySelectorAll('#timeline svg .lease').length") == 2


def _short(token: int) -> str:
    """A token as the drawing labels it: whole up to 6 digits, else its last 4."""
    return str(token) if len(str(token)) <= 6 else "\u2026" + str(token)[-4:]


def _console_errors(browser: Browser) -> list[dict]:
    return [entry for entry in browser.console() if entry.get("level") == "SEVERE"]


def _outage_errors(browser: Browser) -> tuple[list[dict], int]:
    """The console's errors but the failed requests of a server that is away (what a browser logs then), and
    how many of those there were."""
    errors = _console_errors(browser)
    others = [entry for entry in errors
              if not (entry.get("source") == "network" and "net::ERR_" in entry.get("message", ""))]
    return others, len(errors) - len(others)


def _restart(browser: Browser, server: ServerProcess, data: Path, tokens: Path, control: str | None) -> ServerProcess:
    """The server stops (the page's stream is cut: it says so) and starts again on its port."""
    port = int(server.url.rsplit(":", 1)[1])
    browser.wait_for("return document.getElementById('status').textContent === 'live'")
    server.stop()
    browser.wait_for("return document.getElementById('status').textContent !== 'live'")
    return _serve(data, tokens, control, port)


def _live_again(browser: Browser, timeout_s: float = 15) -> float:
    """Seconds until the page is live again after a restart (fails past ``timeout_s``)."""
    started = time.monotonic()
    browser.wait_for("return document.getElementById('status').textContent === 'live'", timeout_s=timeout_s)
    return time.monotonic() - started


def _sees_its_scopes_only(browser: Browser) -> None:
    browser.click("#logout")
    _login(browser, SCOPED)
    browser.wait_for("return document.querySelectorAll('#scopes tbody tr').length > 0")
    shown = browser.run("return [...document.querySelectorAll('#scopes tbody tr')].map(r => r.dataset.scope)")
    assert sorted(shown) == ["reports.daily", "reports.weekly"], shown
    assert browser.run("return document.getElementById('health').hidden") is True
    assert browser.run("return document.getElementById('rejections').textContent").startswith("This session sees")


def test_the_dashboard_in_a_headless_browser(tmp_path: Path) -> None:
    require_browser()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN}\n{SCOPED} reports.*\n")
    data = tmp_path / "data"
    server = _serve(data, tokens)
    browser = Browser(tmp_path)
    grants: list[dict] = []
    waiter: threading.Thread | None = None
    try:
        # Auth is on: the data wants a session, and the page asks for a token first.
        assert request(server.url, "GET", "/ui/api/state")[0] == 401
        browser.open(server.url + "/")  # a browser's GET / is sent to /ui/
        _login(browser, ADMIN)
        assert browser.run("return location.pathname") == "/ui/"

        # Grants made by a client appear within a second, each.
        shown_s = [_grant_shown(browser, server.url, scope, holder, grants) for scope, holder in (
            ("billing", "alice"), ("reports.daily", "bob"), ("reports.weekly", "erin"), ("payroll", "dave"))]

        def wait_in_line() -> None:  # a waiter shows in the holder's queue, in order
            try:
                grants.append(_acquire(server.url, "payroll", "carol", ttl_ms=60_000, wait_ms=30_000))
            except OSError:
                pass  # the server restarted while it waited (below)

        waiter = threading.Thread(target=wait_in_line)
        waiter.start()
        browser.wait_for("return document.querySelector(`tr[data-scope='payroll']`).textContent.includes('carol')",
                         timeout_s=APPEAR_S * 2)
        # The busiest scope (one waiter) is first.
        assert browser.run("return document.querySelector('#scopes tbody tr').dataset.scope") == "payroll"

        # A fenced-out write: the old token after a newer one wrote. Counted, and drawn on the timeline.
        old, new = _fence_out(server.url, grants)
        browser.wait_for("return document.querySelector('dd[data-reason=stale]').textContent === '1'",
                         timeout_s=APPEAR_S)
        browser.wait_for("return document.querySelector(`tr[data-scope='billing']`).textContent.includes('frank')")
        foreign = browser.run("return performance.getEntriesByType('resource').map(e => e.name)"
                              ".filter(n => !n.startsWith(location.origin))")
        assert foreign == []
        _no_secrets(browser.run("return document.documentElement.outerHTML"), grants)
        if os.environ.get("STOCKADE_SCREENSHOTS") == "1":
            browser.screenshot(DOCS_IMAGES / "dashboard-scopes.png")
        browser.screenshot(tmp_path / "scopes.png")

        _refusal_on_timeline(browser, server.url, old, new)
        _no_secrets(browser.run("return document.documentElement.outerHTML"), grants)
        if os.environ.get("STOCKADE_SCREENSHOTS") == "1":
            browser.screenshot(DOCS_IMAGES / "dashboard-timeline.png")
        browser.screenshot(tmp_path / "timeline.png")
        errors = _console_errors(browser)
        assert errors == [], errors

        # The stream is cut (the server restarts): the page says so, reconnects, and is live again.
        browser.open(server.url + "/ui/")
        server = _restart(browser, server, data, tokens, None)
        reconnect_s = _live_again(browser)
        waiter.join(30)
        shown_s.append(_grant_shown(browser, server.url, "after.restart", "gina", grants))
        outage, refused = _outage_errors(browser)  # the requests refused while the server was away: all it logged
        assert outage == [], outage

        # A scope-limited token sees its scopes only, and not the server's health.
        _sees_its_scopes_only(browser)
        _no_secrets(browser.run("return document.documentElement.outerHTML"), grants)
        browser.screenshot(tmp_path / "limited.png")
        errors = _console_errors(browser)
        assert errors == [], errors
        print(f"grants shown after {', '.join(f'{s * 1000:.0f}' for s in shown_s)} ms (bound {APPEAR_S} s); "
              f"live again {reconnect_s * 1000:.0f} ms after the server restarted ({refused} refused requests logged "
              "meanwhile)")
    finally:
        browser.close()
        server.stop()
        if waiter is not None:
            waiter.join(30)


@pytest.mark.parametrize("control", ["frozen-stream", "drops-refusals", "console-error", "no-reconnect",
                                     "sees-every-scope"])
def test_control_a_broken_dashboard_fails_the_browser_walk(tmp_path: Path, control: str) -> None:
    """Each control breaks one thing the walk above checks; that check, run the same way, fails on it."""
    require_browser()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN}\n{SCOPED} reports.*\n")
    data = tmp_path / "data"
    server = _serve(data, tokens, control)
    browser = Browser(tmp_path)
    grants: list[dict] = []
    try:
        browser.open(server.url + "/ui/")
        _login(browser, ADMIN)
        for scope in ("billing", "reports.daily", "reports.weekly"):
            grants.append(_acquire(server.url, scope, "h"))
        if control == "no-reconnect":
            server = _restart(browser, server, data, tokens, control)
        with pytest.raises(AssertionError) as caught:
            if control == "frozen-stream":
                _grant_shown(browser, server.url, "payroll", "dave", grants)
            elif control == "drops-refusals":
                _refusal_on_timeline(browser, server.url, *_fence_out(server.url, grants))
            elif control == "console-error":
                errors = _console_errors(browser)
                assert errors == [], errors
            elif control == "no-reconnect":
                _live_again(browser, timeout_s=5)
            else:
                _sees_its_scopes_only(browser)
        print(f"control {control}: {str(caught.value).splitlines()[0][:200]}")
    finally:
        browser.close()
        server.stop()
