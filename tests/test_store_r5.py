"""R5 under a flood: every rejection counted, the log bounded, and no series per scope.

The finding: after 10,000 junk rejections on made-up scopes, an honest scope's
rejection had no series of its own any more (folded into ``scope="_overflow"``),
and every rejection wrote a WARNING record, so the log grew without bound.
"""

from __future__ import annotations

import logging

import pytest

from stockade import metrics
from stockade.core.errors import StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.resources import _observe
from stockade.resources.store import SQLiteStore

CLUSTER = "0123456789abcdef"
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
    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog(lines=20, interval_s=10.0, clock=clock))
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
        print(f"\n[figure] R5 flood: {FLOOD} rejections in one interval -> {len(records) - 1} lines logged "
              f"(20 records + 1 'suppressed {summaries[0].suppressed}' summary at the next interval); "
              f"counter {counted - 1:.0f} (+1 in the next interval)")
    assert counted == FLOOD + 1  # every rejection counted, the flood and the one after it
    assert len(records) == 20 + 1 + 1  # 20 in the first interval; then the summary and one record
    assert summaries[0].suppressed == FLOOD - 20 == suppressed
    assert summaries[0].suppressed_by_reason == {"stale": FLOOD - 20}
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

    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog(lines=20, interval_s=1.0))
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
    assert lines <= (20 + 1) * (int(elapsed) + 2)
