"""The client's work in a lock cycle through `stockade serve`, counted, against its budget (`stockade.testing.budgets`).

``client.lock_cycle``: the Python and C function calls on the caller's thread while the sync client
acquires and releases a lease (keepalive off) through a server running in another thread of this
process, whose own calls are not counted. A count, not a time: the same on every run, whatever the
machine's load. Each control adds back work the client once did on every request (a lease path
redacted for a message nobody prints, a token decoded twice) and must exceed the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.work_budget import calls_of, served

import stockade
from stockade.core import leases as core_leases
from stockade.core.tokens import FencingToken
from stockade.testing.budgets import BUDGETS, over_budget
from stockade.transport._sync import http_client
from stockade.wire import codecs

CYCLES = 20  # the figure is an exact count, the same on every run
WARMUP = 5


def _client_lock_cycle(data_dir: Path) -> dict[str, float]:
    with served(data_dir) as s:
        coord = stockade.connect(s.url)
        try:
            for _ in range(WARMUP):
                coord.acquire("s", ttl_ms=10_000, keepalive=False).release()
            calls = calls_of(lambda: coord.acquire("s", ttl_ms=10_000, keepalive=False).release(), CYCLES)
            return {"calls": calls / CYCLES}
        finally:
            coord.close()


# -- controls: the work each budget is there to catch ----------------------------------------------

def _redact_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request's path redacted up front, for an error message that is seldom made (as before)."""
    request = http_client.HTTPClient.request

    def redacting(self: Any, method: str, path: str, **kwargs: Any) -> Any:
        core_leases.redact_lease_path(path)
        return request(self, method, path, **kwargs)

    monkeypatch.setattr(http_client.HTTPClient, "request", redacting)


def _decode_the_token_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grant's token checked by `FencingToken.decode` as well as by the grant's own reading (as before)."""
    grant_from = codecs.grant_from

    def twice(doc: Any, **kwargs: Any) -> Any:
        FencingToken.decode(doc["token"])
        return grant_from(doc, **kwargs)

    monkeypatch.setattr(codecs, "grant_from", twice)


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[Callable[[], dict[str, float]]]:
    yield lambda: _client_lock_cycle(tmp_path)


def test_client_lock_cycle_within_budget(counted: Callable[[], dict[str, float]]) -> None:
    measured = counted()
    assert over_budget("client.lock_cycle", measured) == [], measured


@pytest.mark.parametrize("control", [_redact_every_request, _decode_the_token_twice])
def test_client_lock_cycle_controls_exceed(counted: Callable[[], dict[str, float]], monkeypatch: pytest.MonkeyPatch,
                                           control: Callable[[pytest.MonkeyPatch], None]) -> None:
    control(monkeypatch)
    found = over_budget("client.lock_cycle", counted())
    assert [line.split()[1] for line in found] == ["calls"], found


def test_the_budget_is_a_count_of_calls() -> None:
    assert set(BUDGETS["client.lock_cycle"]) == {"calls"}
