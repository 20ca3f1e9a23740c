"""``/metrics`` gauges: stockade_leases_held, stockade_waiters, stockade_scopes, on a real server, and their cost.

The values are checked against a known sequence of grants, a queued waiter
and releases (judged by state reached, polled a bounded number of times).
The cost is checked without a clock: a scrape runs against a lease table
that fails on any iteration, so a scrape that scanned the scopes would fail
(the control does exactly that, and must).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, request, start_server  # noqa: E402

from stockade.server import _metrics  # noqa: E402
from stockade.server.app import App  # noqa: E402

GAUGES = ("stockade_leases_held", "stockade_waiters", "stockade_scopes")
POLLS_MAX = 400


def gauges(url: str) -> dict[str, float]:
    status, headers, body = request(url, "GET", "/metrics")
    assert status == 200
    values = {}
    lines = body.decode().splitlines()
    for name in GAUGES:
        assert f"# TYPE {name} gauge" in lines
        values[name] = float(next(line.split()[1] for line in lines if line.startswith(name + " ")))
    return values


def wait_for(url: str, wanted: dict[str, float]) -> dict[str, float]:
    seen: dict[str, float] = {}
    for _ in range(POLLS_MAX):
        seen = gauges(url)
        if all(seen[k] == v for k, v in wanted.items()):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"gauges never reached {wanted}: {seen}")


def acquire(url: str, scope: str, wait_ms: int = 0) -> dict[str, Any]:
    status, _, body = request(url, "POST", f"/v1/locks/{scope}/acquire",
                              json_body={"ttl_ms": 60_000, "wait_ms": wait_ms})
    assert status == 200, body
    return dict(json.loads(body))


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    process = start_server(tmp_path / "server")
    yield process
    process.stop()


def test_gauges_follow_the_lease_table(server: ServerProcess) -> None:
    url = server.url
    assert gauges(url) == {"stockade_leases_held": 0, "stockade_waiters": 0, "stockade_scopes": 0}
    a = acquire(url, "a")
    b = acquire(url, "b")
    assert gauges(url) == {"stockade_leases_held": 2, "stockade_waiters": 0, "stockade_scopes": 2}
    granted: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: granted.append(acquire(url, "a", wait_ms=60_000)))
    waiter.start()
    wait_for(url, {"stockade_waiters": 1})
    assert request(url, "DELETE", f"/v1/leases/{a['lease_id']}")[0] == 204
    waiter.join(60)
    assert granted and granted[0]["scope"] == "a"
    assert gauges(url) == {"stockade_leases_held": 2, "stockade_waiters": 0, "stockade_scopes": 2}
    for lease in (b, granted[0]):
        assert request(url, "DELETE", f"/v1/leases/{lease['lease_id']}")[0] == 204
    assert gauges(url) == {"stockade_leases_held": 0, "stockade_waiters": 0, "stockade_scopes": 2}


class _NoScan(Sequence[str]):
    """A collection of ``size`` items that fails if anything reads one: only ``len`` is allowed."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("a scrape read the scopes one by one")

    def __iter__(self) -> Any:
        raise AssertionError("a scrape iterated the scopes")


class _Table:
    def __init__(self, scopes: int, leases: int, waiters: int) -> None:
        self.names = _NoScan(scopes)
        self.waiters = _NoScan(waiters)
        self.leases = leases

    @property
    def records(self) -> Any:
        raise AssertionError("a scrape read the records")


class _StubApp:
    def __init__(self) -> None:
        self.leases = _Table(scopes=100_000, leases=1234, waiters=7)


def _scanning_metrics(self: Any, request: Any) -> Any:
    """The control: counts held leases by walking the scopes, as a naive scrape would."""
    held = sum(1 for name in self.leases.names if self.leases.records[name].lease is not None)
    _metrics.LEASES_HELD.set(held)
    return None


@pytest.mark.parametrize("variant", ["stockade", "control-scan"])
def test_a_scrape_reads_no_scope(variant: str) -> None:
    scrape = App.metrics if variant == "stockade" else _scanning_metrics
    if variant == "control-scan":
        with pytest.raises(AssertionError, match="scrape"):
            scrape(_StubApp(), None)
        return
    response = scrape(_StubApp(), None)  # type: ignore[arg-type]
    text = response.body.decode()
    assert "stockade_leases_held 1234\n" in text
    assert "stockade_waiters 7\n" in text
    assert "stockade_scopes 100000\n" in text
