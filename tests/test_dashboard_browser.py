"""The dashboard (docs/dashboard.md) in a real headless Chromium, against a real ``stockade serve`` with auth on.

One browser walks through what an operator does: logs in with a token, sees a
grant made by a client appear within a second, sees a fenced-out write counted
and drawn on the scope's timeline with both tokens, keeps a live page across a
server restart, and logs in again with a scope-limited token that sees only its
scopes. Every wait is a poll of the page's DOM with a deadline, never a sleep.
The browser cannot resolve any host but 127.0.0.1, and the test checks that the
page asked nothing of another origin and logged no console error. Screenshots
go to docs/images/ when STOCKADE_SCREENSHOTS=1 (they are committed from such a run).

In CI (CI=true) a missing Chromium fails the test: it is never skipped there.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from conftest import HELPERS

sys.path.insert(0, str(HELPERS))
from browser import Browser, require_browser  # noqa: E402
from server_fixtures import request, start_server  # noqa: E402

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


def _row_shown(browser: Browser, scope: str) -> float:
    """Seconds until ``scope``'s row is on the page (fails past APPEAR_S)."""
    started = time.monotonic()
    browser.wait_for("return !!document.querySelector(`#scopes tr[data-scope='${arguments[0]}']`)", scope,
                     timeout_s=APPEAR_S)
    return time.monotonic() - started


def _no_secrets(page: str, grants: list[dict]) -> None:
    for grant in grants:
        mac = grant["token"].split(".")[4]
        assert grant["lease_id"] not in page and grant["token"] not in page and mac not in page


def _login(browser: Browser, token: str) -> None:
    browser.wait_for("return !document.getElementById('login').hidden")
    browser.type_into("#token", token)
    browser.click("#login button[type=submit]")
    browser.wait_for("return document.getElementById('status').textContent === 'live'")


def test_the_dashboard_in_a_headless_browser(tmp_path: Path) -> None:
    require_browser()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN}\n{SCOPED} reports.*\n")
    data = tmp_path / "data"
    server = start_server(data, "--auth-tokens", str(tokens))
    port = int(server.url.rsplit(":", 1)[1])
    browser = Browser(tmp_path)
    grants: list[dict] = []
    waiter: threading.Thread | None = None
    try:
        browser.open(server.url + "/")  # a browser's GET / is sent to /ui/
        _login(browser, ADMIN)
        assert browser.run("return location.pathname") == "/ui/"

        # Grants made by a client appear within a second, each.
        shown_s = []
        for scope, holder in (("billing", "alice"), ("reports.daily", "bob"), ("reports.weekly", "erin"),
                              ("payroll", "dave")):
            grants.append(_acquire(server.url, scope, holder))
            shown_s.append(_row_shown(browser, scope))
        # A waiter shows in the holder's queue, in order.
        def wait_in_line() -> None:
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
        old = grants[0]
        assert request(server.url, "DELETE", f"/v1/leases/{old['lease_id']}",
                       headers={"Authorization": f"Bearer {ADMIN}"})[0] == 204
        new = _acquire(server.url, "billing", "frank")
        grants.append(new)
        assert _put(server.url, "billing", new["token"]) == 200
        assert _put(server.url, "billing", old["token"]) == 409
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

        browser.open(server.url + "/ui/scope/billing")
        browser.wait_for("return !!document.querySelector('#timeline table.events tr.refused')")
        refused = browser.run("return document.querySelector('#timeline table.events tr.refused').textContent")
        assert str(old["token_value"]) in refused and f"high-water {new['token_value']}" in refused, refused
        assert browser.run("return document.querySelectorAll('#timeline svg .lease').length") == 2
        _no_secrets(browser.run("return document.documentElement.outerHTML"), grants)
        if os.environ.get("STOCKADE_SCREENSHOTS") == "1":
            browser.screenshot(DOCS_IMAGES / "dashboard-timeline.png")
        browser.screenshot(tmp_path / "timeline.png")
        errors = [entry for entry in browser.console() if entry.get("level") == "SEVERE"]
        assert errors == [], errors

        # The stream is cut (the server restarts): the page says so, reconnects, and is live again.
        browser.open(server.url + "/ui/")
        browser.wait_for("return document.getElementById('status').textContent === 'live'")
        server.stop()
        waiter.join(30)
        browser.wait_for("return document.getElementById('status').textContent !== 'live'")
        server = start_server(data, "--auth-tokens", str(tokens), port=port)
        browser.wait_for("return document.getElementById('status').textContent === 'live'", timeout_s=15)
        grants.append(_acquire(server.url, "after.restart", "gina"))
        shown_s.append(_row_shown(browser, "after.restart"))

        # A scope-limited token sees its scopes only, and not the server's health.
        browser.click("#logout")
        _login(browser, SCOPED)
        browser.wait_for("return document.querySelectorAll('#scopes tbody tr').length === 2")
        shown = browser.run("return [...document.querySelectorAll('#scopes tbody tr')].map(r => r.dataset.scope)")
        assert sorted(shown) == ["reports.daily", "reports.weekly"]
        assert browser.run("return document.getElementById('health').hidden") is True
        print(f"grants shown after {', '.join(f'{s * 1000:.0f}' for s in shown_s)} ms (bound {APPEAR_S} s)")
    finally:
        browser.close()
        server.stop()
        if waiter is not None:
            waiter.join(30)
