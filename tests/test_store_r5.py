"""R5 under a flood: every rejection counted, the log bounded, no series per scope, and no honest record hidden.

The first finding: after 10,000 junk rejections on made-up scopes, an honest
scope's rejection had no series of its own any more (folded into
``scope="_overflow"``), and every rejection wrote a WARNING record, so the log
grew without bound.

The second: the bound that fixed it was 20 records per 10 s for every scope
and reason together, so after 10,000 junk rejections an honest scope's stale
write got no record at all. Now the first rejection of each (scope, reason)
in a window is logged, up to a number of scopes per reason
(`stockade.resources._observe`); `OldLimit` below is the old bound, kept as
the control.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from stockade import metrics
from stockade.core.errors import StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import _observe
from stockade.resources.memory import MemoryStore
from stockade.resources.store import SQLiteStore

CLUSTER = "0123456789abcdef"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
JUNK = 10_000  # the finding's figure
# The finding's flood was 10,000 junk scopes, past the old cap on per-scope series; the metric has no
# scope label any more (checked below), so a flood 100 times the line limit shows the same. Each
# rejection is journaled with its own fsync (~2 ms, far more on a loaded disk).
FLOOD = 2_001
REAL_CLOCK_FLOOD = 2_000  # several intervals of 1 s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_rejections_is_counted_whole_and_logged_within_the_limit(tmp_path, caplog, monkeypatch, capsys):
    clock = FakeClock()
    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog(interval_s=10.0, clock=clock))
    shown = _observe.SCOPES_PER_REASON_MAX
    stale_before = metrics.FENCE_REJECTIONS.value(reason="stale")
    suppressed_before = metrics.FENCE_REJECTION_LOGS_SUPPRESSED.value()
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned") as store:
        # junk: a made-up scope each, raised to 2 (in one transaction) and then written with 1
        store.raise_high_waters({f"junk-{i}": 2 for i in range(FLOOD - 1)})
        with caplog.at_level(logging.WARNING, logger="stockade.fence"):
            for i in range(FLOOD - 1):
                with pytest.raises(StaleToken):
                    store.put(f"junk-{i}", "k", b"x", token=FencingToken(CLUSTER, f"junk-{i}", 1))
            store.put("honest", "k", b"v", token=FencingToken(CLUSTER, "honest", 5))
            with pytest.raises(StaleToken):  # the honest scope's own stale write, the FLOOD-th rejection
                store.put("honest", "k", b"zombie", token=FencingToken(CLUSTER, "honest", 4))
            clock.now += 10.0  # the next interval: its first record carries the summary
            with pytest.raises(StaleToken):
                store.put("honest", "k", b"zombie", token=FencingToken(CLUSTER, "honest", 3))
    records = [r for r in caplog.records if r.name == "stockade.fence"]
    summaries = [r for r in records if hasattr(r, "suppressed")]
    counted = metrics.FENCE_REJECTIONS.value(reason="stale") - stale_before
    suppressed = metrics.FENCE_REJECTION_LOGS_SUPPRESSED.value() - suppressed_before
    with capsys.disabled():
        print(f"\n[figure] R5 flood: {FLOOD} stale rejections on {FLOOD} scopes in one interval -> "
              f"{len(records) - 1} lines logged ({shown} records + 1 '{summaries[0].suppressed} more' summary at "
              f"the next interval); counter {counted - 1:.0f} (+1 in the next interval)")
    assert counted == FLOOD + 1  # every rejection counted, the flood and the one after it
    assert len(records) == shown + 1 + 1  # one per scope, `shown` scopes, in the first interval; then 2
    assert summaries[0].suppressed == FLOOD - shown == suppressed
    assert summaries[0].suppressed_by_reason == {"stale": FLOOD - shown}
    assert len(summaries[0].sample_scopes) <= _observe.SAMPLE_SCOPES_MAX
    assert records[-1].scope == "honest" and records[-1].token_value == 3


def test_the_rejection_metric_has_one_series_per_reason_and_no_overflow(tmp_path, monkeypatch):
    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog())
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned") as store:
        for i in range(50):
            with pytest.raises(TokenMismatch):
                store.put(f"made-up-{i}", "k", b"x", token=FencingToken(CLUSTER, f"other-{i}", 1))
    lines = [line for line in metrics.REGISTRY.render().splitlines()
             if line.startswith("stockade_fence_rejections_total{")]
    assert lines and all(line.startswith('stockade_fence_rejections_total{reason="') for line in lines)
    assert len(lines) <= 4 and "_overflow" not in metrics.REGISTRY.render()  # stale, wrong-scope, wrong-cluster, forged
    assert metrics.FENCE_REJECTIONS.labels == ("reason",)


def test_real_clock_bound_on_lines(tmp_path, caplog, monkeypatch):
    """The same flood on the real clock: lines stay within the limit for the time it took."""
    import time

    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog(interval_s=1.0))
    before = metrics.FENCE_REJECTIONS.value(reason="stale")
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned") as store:
        store.put("s", "k", b"v", token=FencingToken(CLUSTER, "s", 9))
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="stockade.fence"):
            for _ in range(REAL_CLOCK_FLOOD):
                with pytest.raises(StaleToken):
                    store.put("s", "k", b"x", token=FencingToken(CLUSTER, "s", 1))
        elapsed = time.monotonic() - started
    lines = len([r for r in caplog.records if r.name == "stockade.fence"])
    assert metrics.FENCE_REJECTIONS.value(reason="stale") - before == REAL_CLOCK_FLOOD
    assert lines <= (1 + 1) * (int(elapsed) + 2)  # one scope: one record and one summary per interval


class OldLimit(_observe.RejectionLog):
    """The control: the bound this change replaced, 20 records per 10 s for every scope and reason together."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(interval_s=10.0, clock=clock)
        self._start: float | None = None
        self._written = 0

    def admit(self, scope: str, reason: str) -> tuple[bool, None]:
        now = self._clock()
        if self._start is None or now - self._start >= self.interval_s:
            self._start, self._written = now, 0
        self._written += 1
        return self._written <= 20, None


def signed(scope: str, value: int) -> FencingToken:
    return KEYS.sign(FencingToken(CLUSTER, scope, value))


def junk_forged(store: MemoryStore) -> None:
    """A writer without the keys: made-up tokens on made-up scopes."""
    for i in range(JUNK):
        with pytest.raises(TokenMismatch):
            store.put(f"made-up-{i}", "k", b"x", token=FencingToken(CLUSTER, f"made-up-{i}", 1))


def junk_wrong_scope(store: MemoryStore) -> None:
    """One real token replayed on made-up scopes."""
    token = signed("real", 1)
    for i in range(JUNK):
        with pytest.raises(TokenMismatch):
            store.put(f"made-up-{i}", "k", b"x", token=token)


def junk_zombie(store: MemoryStore) -> None:
    """A zombie retrying its stale write on its own scope."""
    store.put("zombie", "k", b"new", token=signed("zombie", 9))
    for _ in range(JUNK):
        with pytest.raises(StaleToken):
            store.put("zombie", "k", b"old", token=signed("zombie", 8))


JUNK_KINDS = {"forged-made-up-scopes": junk_forged, "wrong-scope-made-up-scopes": junk_wrong_scope,
              "one-zombie-retrying": junk_zombie}


def flood_then_honest(junk: Callable[[MemoryStore], None], limit: _observe.RejectionLog,
                      caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """JUNK junk rejections, then an honest scope's stale write, all in one interval: the records written."""
    caplog.clear()
    store = MemoryStore(cluster_id=CLUSTER, keys=KEYS)
    store.put("honest", "k", b"v", token=signed("honest", 5))
    with caplog.at_level(logging.WARNING, logger="stockade.fence"):
        junk(store)
        with pytest.raises(StaleToken):
            store.put("honest", "k", b"zombie", token=signed("honest", 4))
    return [r for r in caplog.records if r.name == "stockade.fence"]


def honest_logged(records: list[logging.LogRecord]) -> bool:
    return any(getattr(r, "scope", None) == "honest" and getattr(r, "reason", None) == "stale" for r in records)


@pytest.mark.parametrize("kind", list(JUNK_KINDS))
def test_junk_cannot_hide_an_honest_scopes_stale_write(kind: str, caplog, monkeypatch, capsys) -> None:
    clock = FakeClock()
    limit = _observe.RejectionLog(interval_s=10.0, clock=clock)
    monkeypatch.setattr(_observe, "_limit", limit)
    before = metrics.FENCE_REJECTIONS.value(reason="stale")
    records = flood_then_honest(JUNK_KINDS[kind], limit, caplog)
    remembered = sum(len(scopes) for scopes in limit._logged.values())
    clock.now += 10.0  # the next interval: its first record says what the last one left out
    with caplog.at_level(logging.WARNING, logger="stockade.fence"):
        _one_more_rejection()
    summaries = [r for r in caplog.records if hasattr(r, "suppressed")]
    with capsys.disabled():
        print(f"\n[figure] R5 {kind}: {JUNK} junk rejections then 1 honest stale write -> {len(records)} records "
              f"(honest logged: {honest_logged(records)}), {remembered} pairs remembered; then "
              f"'{summaries[0].suppressed} more rejections not logged'")
    assert honest_logged(records)
    assert len(records) <= _observe.SCOPES_PER_REASON_MAX + 1  # the junk's share and the honest one
    assert len(records) <= _observe.LOG_LINES_PER_INTERVAL and remembered <= _observe.LOG_LINES_PER_INTERVAL
    assert summaries[0].suppressed == JUNK - (len(records) - 1)
    assert metrics.FENCE_REJECTIONS.value(reason="stale") - before >= 1  # every one counted, as before


def _one_more_rejection() -> None:
    store = MemoryStore(cluster_id=CLUSTER, keys=KEYS)
    with pytest.raises(TokenMismatch):
        store.put("later", "k", b"x", token=FencingToken(CLUSTER, "later", 1))


def test_control_the_old_bound_hides_the_honest_write(caplog, monkeypatch, capsys) -> None:
    """The same floods under the old bound (20 records per 10 s, all together): the honest record is missing."""
    missed = 0
    for junk in JUNK_KINDS.values():
        limit = OldLimit(FakeClock())
        monkeypatch.setattr(_observe, "_limit", limit)
        missed += not honest_logged(flood_then_honest(junk, limit, caplog))
    with capsys.disabled():
        print(f"\n[figure] R5 control (old bound): honest stale write unlogged after {JUNK} junk rejections "
              f"in {missed} of {len(JUNK_KINDS)} floods")
    assert missed == len(JUNK_KINDS)


def test_docs_state_the_bound_the_code_keeps() -> None:
    from pathlib import Path

    rules = " ".join((Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text().split())
    assert f"a window of {_observe.LOG_INTERVAL_S:g} s" in rules
    assert f"up to {_observe.SCOPES_PER_REASON_MAX} scopes" in rules
    assert f"{_observe.LOG_LINES_PER_INTERVAL} records at most" in rules
    assert len(_observe.REASONS) == 4 and all(f"`{reason}`" in rules for reason in _observe.REASONS)
