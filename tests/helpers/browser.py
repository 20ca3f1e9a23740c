"""A real headless Chromium, driven through chromedriver's W3C WebDriver protocol (plain HTTP + JSON).

No client library: the few commands the dashboard's tests need (open a page,
run a script, type, click, read the console, take a screenshot) are a dozen
lines of urllib. The browser runs with every host name but 127.0.0.1 made
unresolvable, so a page that needed the internet (a CDN, a web font) would
fail to load it, and the tests check that nothing was asked of another origin.

``require_browser()`` fails (never skips) in CI when Debian's ``chromium`` and
``chromium-driver`` are missing: the dashboard's browser tests are part of the suite.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_port as _free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
STARTUP_S = 30.0


def require_browser() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if missing:
        message = f"the dashboard's browser tests need {missing}: apt-get install chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


class BrowserError(Exception):
    """A WebDriver command failed (its error and message)."""


class Browser:
    """One chromedriver and one headless Chromium session (``close`` ends both)."""

    def __init__(self, directory: Path, *, width: int = 1366, height: int = 768) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(directory / "chromedriver.log", "wb")  # noqa: SIM115 - closed in close()
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=self.log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        reaper.watch(self.driver.pid)
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, BrowserError):
                pass
            if time.monotonic() > deadline or self.driver.poll() is not None:
                self.close()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.05)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", f"--user-data-dir={directory / 'profile'}",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
        capabilities = {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
                        "goog:loggingPrefs": {"browser": "ALL"}}
        self.session = ""
        try:
            answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        except BaseException:
            self.close()
            raise
        self.session = answer["sessionId"]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            document = json.loads(exc.read() or b"{}")
            value = document.get("value", {})
            raise BrowserError(f"{value.get('error')}: {str(value.get('message'))[:500]}") from None
        return document.get("value")

    def _session(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """Run ``script`` (a function body; ``arguments`` holds ``args``) in the page and return its value."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, *args: Any, timeout_s: float = 10.0) -> Any:
        """Poll ``script`` until it returns something truthy (its value), or fail at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout_s} s: {script}")
            time.sleep(0.02)

    def type_into(self, css: str, text: str) -> None:
        element = self._session("POST", "/element", {"using": "css selector", "value": css})
        key = next(iter(element.values()))
        self._session("POST", f"/element/{key}/value", {"text": text})

    def click(self, css: str) -> None:
        element = self._session("POST", "/element", {"using": "css selector", "value": css})
        self._session("POST", f"/element/{next(iter(element.values()))}/click", {})

    def console(self) -> list[dict[str, Any]]:
        """The browser console's entries since the last call (level, message)."""
        return list(self._session("POST", "/se/log", {"type": "browser"}))

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
        return path

    def close(self) -> None:
        if self.session:
            try:
                self._session("DELETE", "")
            except (OSError, BrowserError):
                pass
        if self.driver.poll() is None:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait(10)
        self.log.close()
