"""Telemetry hooks: grant, renew, loss, release, fence rejection; a failing hook breaks nothing.

The hooks run against every coordinator backend (a real `stockade serve` for
``http``), sync and async. OpenTelemetry is optional: its spans are tested with
a small stand-in for ``opentelemetry.trace`` put in ``sys.modules`` (the real
API without an SDK records nothing to look at).
"""

from __future__ import annotations

import sys
import threading
import types

import pytest

import stockade
from stockade import LeaseLost, StaleToken
from stockade.client import Hooks, _hooks


class Recorder:
    """Hooks that record ``(event, scope, token value)``; one may be told to raise."""

    def __init__(self, raising: str = "") -> None:
        self.events: list[tuple[str, str, int]] = []
        self.renewed = threading.Event()
        self.raising = raising

    def _record(self, name: str, scope: str, value: int) -> None:
        self.events.append((name, scope, value))
        if name == "renew":
            self.renewed.set()
        if name == self.raising:
            raise RuntimeError(f"hook {name} broke")

    def hooks(self) -> Hooks:
        return Hooks(
            on_grant=lambda lease: self._record("grant", lease.scope, lease.token.value),
            on_renew=lambda lease: self._record("renew", lease.scope, lease.token.value),
            on_lost=lambda lease: self._record("lost", lease.scope, lease.token.value),
            on_release=lambda lease: self._record("release", lease.scope, lease.token.value),
            on_reject=lambda error: self._record("reject", error.token.scope, error.token.value),
        )

    def names(self) -> list[str]:
        return [name for name, _, _ in self.events]


@pytest.fixture
def hooked(client):
    """The conftest client runner, with connect taking hooks."""
    if client.mode == "sync":
        client.connect_hooks = lambda url, hooks: stockade.connect(url, hooks=hooks)
    else:
        async def connect_hooks(url, hooks):
            return await stockade.connect_async(url, hooks=hooks)
        client.connect_hooks = connect_hooks
    return client


def test_grant_renew_release_and_reject(hooked, coord_url, store_url):
    client = hooked
    recorder = Recorder()
    coord = client.run(client.connect_hooks(coord_url, recorder.hooks()))
    store = client.open_store(store_url, cluster_id=coord.cluster_id, hooks=recorder.hooks())
    first = client.run(coord.acquire("s", ttl_ms=3000))  # renewed at 1 s: a late renewal at load would add "lost"
    if client.mode == "async":
        client.run(_wait_async(recorder.renewed))  # the keepalive task runs while the loop does
    else:
        assert recorder.renewed.wait(5)
    client.run(store.put("s", "k", b"v", token=first.token))
    client.run(first.release())
    second = client.run(coord.acquire("s", ttl_ms=1000, keepalive=False))
    client.run(store.put("s", "k", b"w", token=second.token))
    with pytest.raises(StaleToken):
        client.run(store.put("s", "k", b"zombie", token=first.token))
    client.run(second.release())
    client.run(second.release())  # idempotent: reported once
    names = recorder.names()
    assert names[0] == "grant" and "renew" in names
    assert [n for n in names if n != "renew"] == ["grant", "release", "grant", "reject", "release"]
    assert recorder.events[-2] == ("reject", "s", first.token.value)
    client.run(store.aclose() if client.mode == "async" else store.close())
    client.run(coord.aclose() if client.mode == "async" else coord.close())


async def _wait_async(event: threading.Event) -> None:
    import asyncio

    for _ in range(500):
        if event.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no renewal seen in 5 s")


@pytest.mark.parametrize("raising", ["grant", "renew", "lost", "release", "reject"])
def test_a_raising_hook_is_logged_and_the_lease_goes_on(tmp_path, caplog, raising):
    url = f"memory://{tmp_path.name}"
    recorder = Recorder(raising=raising)
    coord = stockade.connect(url, hooks=recorder.hooks())
    store = stockade.open_store(url, cluster_id=coord.cluster_id, hooks=recorder.hooks())
    with pytest.raises(LeaseLost):  # the block ends without its lease, and says so
        with coord.lock("s", ttl_ms=3000) as lease:
            assert recorder.renewed.wait(5)
            store.put("s", "k", b"v")
            assert not lease.lost  # renewals went on after a raising on_renew
            coord._port.release(lease.lease_id)
            assert lease.wait_lost(timeout_ms=5000)
    newer = coord.acquire("s", ttl_ms=150, keepalive=False)
    store.put("s", "k", b"w", token=newer.token)
    with pytest.raises(StaleToken):  # the writer still sees its own error, not the hook's
        store.put("s", "k", b"zombie", token=lease.token)
    newer.release()
    assert recorder.names().count(raising) >= 1
    assert f"hook on_{raising} raised" in caplog.text and f"hook {raising} broke" in caplog.text
    coord.close()


def test_lost_hook_precedes_release_and_names_the_cause(tmp_path):
    url = f"memory://{tmp_path.name}"
    causes = []
    hooks = Hooks(on_lost=lambda lease: causes.append(lease.lost_cause))
    coord = stockade.connect(url, hooks=hooks)
    with pytest.raises(LeaseLost):  # the block ends without its lease, and says so
        with coord.lock("s", ttl_ms=1000, max_hold_ms=200) as lease:
            assert lease.wait_lost(timeout_ms=5000)
    assert causes == ["max_hold_ms=200 reached"]
    coord.close()


def test_hooks_are_validated(tmp_path):
    with pytest.raises(stockade.InvalidArgument):
        Hooks(on_grant="print")
    with pytest.raises(stockade.InvalidArgument):
        stockade.connect(f"memory://{tmp_path.name}", hooks={"on_grant": print})
    with pytest.raises(stockade.InvalidArgument):
        stockade.open_store(f"memory://{tmp_path.name}", hooks=print)


# -- OpenTelemetry, when installed --------------------------------------------------------------


class _Span:
    def __init__(self, name, attributes):
        self.name, self.attributes = name, dict(attributes or {})
        self.events, self.status, self.ended = [], None, False

    def add_event(self, name, attributes=None):
        self.events.append((name, dict(attributes or {})))

    def set_status(self, status):
        self.status = status

    def end(self):
        self.ended = True


@pytest.fixture
def otel(monkeypatch):
    """A stand-in ``opentelemetry.trace`` with the calls stockade makes; yields the spans started."""
    spans: list[_Span] = []
    trace = types.ModuleType("opentelemetry.trace")

    class Tracer:
        def start_span(self, name, attributes=None):
            spans.append(_Span(name, attributes))
            return spans[-1]

    trace.get_tracer = lambda name: Tracer()
    trace.StatusCode = types.SimpleNamespace(ERROR="ERROR")
    trace.Status = lambda code, description: (code, description)
    package = types.ModuleType("opentelemetry")
    package.trace = trace
    monkeypatch.setitem(sys.modules, "opentelemetry", package)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", trace)
    monkeypatch.setattr(_hooks, "_tracer", _hooks._UNSET)
    yield spans
    monkeypatch.setattr(_hooks, "_tracer", _hooks._UNSET)


def test_opentelemetry_spans(tmp_path, otel):
    url = f"memory://{tmp_path.name}"
    coord = stockade.connect(url)
    store = stockade.open_store(url, cluster_id=coord.cluster_id)
    with pytest.raises(LeaseLost):  # the block ends without its lease, and says so
        with coord.lock("s", ttl_ms=150) as first:
            store.put("s", "k", b"v")
            coord._port.release(first.lease_id)
            assert first.wait_lost(timeout_ms=5000)
    with coord.lock("s", ttl_ms=3000):
        store.put("s", "k", b"w")
    with pytest.raises(StaleToken):
        store.put("s", "k", b"zombie", token=first.token)
    lease_spans = [s for s in otel if s.name == "stockade.lease"]
    assert [s.attributes["stockade.token"] for s in lease_spans] == [first.token.value, first.token.value + 1]
    assert all(s.ended for s in lease_spans)
    lost_span = lease_spans[0]
    assert lost_span.status[0] == "ERROR" and any(name == "stockade.lost" for name, _ in lost_span.events)
    assert lease_spans[1].status is None
    (rejection,) = [s for s in otel if s.name == "stockade.fence_rejected"]
    assert rejection.ended and rejection.attributes["stockade.high_water"] == first.token.value + 1
    assert rejection.attributes["stockade.reason"] == "stale"
    coord.close()


def test_without_opentelemetry_there_are_no_spans(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails, as when not installed
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    monkeypatch.setattr(_hooks, "_tracer", _hooks._UNSET)
    coord = stockade.connect(f"memory://{tmp_path.name}")
    with coord.lock("s", ttl_ms=150):
        pass
    assert _hooks._tracer is None
    coord.close()
    monkeypatch.setattr(_hooks, "_tracer", _hooks._UNSET)


def test_importing_stockade_does_not_import_opentelemetry():
    import subprocess

    code = "import sys, stockade; c = stockade.connect('memory://x'); print('opentelemetry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
