"""The one timeline (`stockade.timeline`): drawn by ``stockade check --report`` and ``stockade history --html``,
opened in a real headless Chromium (lanes, markers, verdicts present; no console error; nothing fetched)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env

import stockade
from stockade.resources.sqlite_db import SQLiteFence
from stockade.timeline import Event, Verdict, render_fragment, render_html, render_text

CHROMIUM = shutil.which("chromium")


def _chromium(page: Path) -> tuple[str, list[str]]:
    """The DOM after load, and the page's console messages (Chromium logs each as ``CONSOLE``)."""
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                             "--v=0", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def _references(page: str) -> list[str]:
    """Every src/href of the page, and every url in its CSS: a self-contained page has none."""
    return re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page) + re.findall(r"url\(([^)]*)\)", page)


def test_check_report_in_headless_chromium(tmp_path: Path) -> None:
    coord_url = f"sqlite:///{tmp_path / 'coord.db'}?process=embedded"  # 300 ms leases: no second process
    with stockade.connect(coord_url) as coord:
        SQLiteFence(tmp_path / "app.db", keys=coord.verify_keys()).close()
    report = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "stockade", "check", "--coordinator", coord_url, "--resource",
                             f"sqlite:///{tmp_path / 'app.db'}", "--rounds", "2", "--ttl-ms", "300", "--report",
                             str(report)], capture_output=True, text=True, timeout=240, env=python_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "timeline:" in result.stdout and "REFUSED" in result.stdout  # the text timeline is printed too
    page = report.read_text()
    assert _references(page) == []
    dom, console = _chromium(report)
    assert console == []
    assert {"A", "B", "C"} <= set(re.findall(r'data-lane="([^"]*)"', dom))
    # the frozen holder's write, refused in each pause round, and the stale holder's across each failover
    assert dom.count('class="write refused"') == 2 + 2
    assert dom.count('class="lease"') >= 2 * 2 + 2 * 3  # leases of both cases
    assert 'class="pause"' in dom and "legend" in dom
    assert re.search(r"<td>pause</td><td class=\"held\">held</td><td>0 of 2 stale writes applied", dom)
    assert '<table id="setup">' in dom


def test_the_console_check_can_fail(tmp_path: Path) -> None:
    """Control: a page with a script error is caught by the same console check."""
    page = tmp_path / "broken.html"
    page.write_text(render_html("broken", [Event(0, "A", "grant", token=1)]).replace(
        "</body>", "<script>not_defined()</script></body>"))
    _, console = _chromium(page)
    assert len(console) == 1 and "not_defined" in console[0]


def test_history_html_draws_the_journal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with stockade.connect(f"sqlite:///{data / 'coord.db'}?process=embedded") as coord, \
            stockade.open_store(f"sqlite:///{data / 'store.db'}", cluster_id=coord.cluster_id) as store:
        first = coord.acquire("reports", ttl_ms=5000, wait_ms=1000, holder="worker-a")
        first.release()
        second = coord.acquire("reports", ttl_ms=5000, wait_ms=1000, holder="worker-b")
        store.put("reports", "k", "b", token=second.token)
        with pytest.raises(stockade.StaleToken):
            store.put("reports", "k", "late", token=first.token)
        second.release()
    page = tmp_path / "history.html"
    result = subprocess.run([sys.executable, "-m", "stockade", "history", "reports", "--data-dir", str(data),
                             "--html", str(page)], capture_output=True, text=True, timeout=60, env=python_env())
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert re.findall(r'data-lane="([^"]*)"', html) == ["worker-a", "worker-b", "refused by the store"]
    assert html.count('class="lease"') == 2 and html.count('class="write refused"') == 1
    assert _references(html) == []


def test_render_text_orders_and_describes() -> None:
    events = [Event(20, "B", "write", token=8, outcome="refused", mark=9, case="pause", text="value"),
              Event(10, "A", "grant", token=7)]
    assert render_text(events).splitlines() == ["  +   0.000s  A  grant token 7",
                                                "  +   0.010s  B  pause: write token 8 REFUSED mark 9 value"]
    page = render_html("t", events, verdicts=[Verdict("pause", False, "1 of 1 <stale>")])
    assert "BROKEN" in page and "&lt;stale&gt;" in page  # escaped
    with pytest.raises(ValueError):
        Event(0, "A", "explode")


_LABEL = re.compile(r'<text (visibility="hidden" )?x="([\d.]+)" y="([\d.]+)" class="(wlabel|leaselabel|faulttext)'
                    r'( left| right| before)?">([^<]*)</text>')


def _overprinted(page: str, *, with_hidden: bool) -> int:
    """Pairs of labels on one row (same y) whose boxes (7.5 px a character, as the renderer reckons) meet."""
    boxes: dict[str, list[tuple[float, float]]] = {}
    for hidden, x, y, _, place, text in _LABEL.findall(page):
        if hidden and not with_hidden:
            continue
        width = 7.5 * len(text.replace("&lt;", "<"))
        left = float(x) - width if place.strip() in ("left", "before") else float(x)
        boxes.setdefault(y, []).append((left, left + width))
    return sum(a[0] < b[1] and b[0] < a[1] for row in boxes.values() for i, a in enumerate(row) for b in row[i + 1:])


def test_labels_that_would_overprint_are_hidden_and_kept() -> None:
    """Twenty pause rounds squeezed into one drawing: no two visible labels of a row meet; every label is still in
    the page (hidden), its mark still drawn. Control: the same labels all shown would overprint."""
    events = [Event(0, "", "note", case="pause", text="case: pause")]
    for r in range(20):
        at, token = 100 + r * 50, 10**18 + 2 * r
        events += [Event(at, "A", "grant", token=token, case="pause"),
                   Event(at + 20, "B", "grant", token=token + 1, case="pause"),
                   Event(at + 30, "", "fault", case="pause", text="coordinator restarted (file reopened)"),
                   Event(at + 40, "A", "write", token=token, outcome="refused", mark=token + 1, case="pause")]
    page = render_fragment(events)
    assert page.count('class="wlabel') == 20 and page.count('class="faulttext">coordinator restarted') == 20
    assert page.count('class="write refused"') == 20 and page.count('class="lease"') == 40
    assert _overprinted(page, with_hidden=False) == 0
    assert 'visibility="hidden"' in page
    assert _overprinted(page, with_hidden=True) > 0  # the control: without hiding, they meet
