"""The server's metrics: counters in `stockade.metrics.REGISTRY`, histograms here.

Label sets are bounded: routes are templates (``/v1/locks/{scope}/acquire``),
never raw paths, and every metric folds label sets beyond
`stockade.metrics.LABEL_SETS_MAX` into one overflow series.
"""

from __future__ import annotations

import bisect
import threading

from stockade import metrics

__all__ = ["Histogram", "LEASES_HELD", "WAITERS", "SCOPES",
           "GRANTS", "RENEWALS", "EXPIRIES", "WAITS", "LOCK_TIMEOUTS", "PROBLEMS", "WAIT_SECONDS",
           "REQUEST_SECONDS", "COMMIT_SECONDS", "render"]

BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
             30.0, 60.0, 300.0)


class Histogram:
    """A Prometheus histogram with fixed buckets (seconds).

    ``one_thread``: only one thread observes it (the request latencies: the server's event loop), so
    an observation takes no lock. A reader copies the series in one step under the GIL (`render`),
    and may miss an observation being made. (A process that ran several servers' loops at once
    could lose an observation between them: a count, never a series.) Otherwise (the commits',
    observed by the committer's thread and by the loop's) every observation takes the lock.
    """

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] = BUCKETS_S, *, one_thread: bool = False) -> None:
        self.name = name
        self.help_text = help_text
        self.labels = labels
        self.buckets = buckets
        self._series: dict[tuple[str, ...], list[float]] = {}  # counts per bucket + [+Inf count, sum]
        self._lock = threading.Lock()
        self._one_thread = one_thread

    def observe(self, value: float, *label_values: str) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if self._one_thread:
            series = self._series[label_values] if label_values in self._series else self._new_series(label_values)
            series[index] += 1
            series[-1] += value
            return
        with self._lock:
            series = self._series[label_values] if label_values in self._series else self._new_series(label_values)
            series[index] += 1
            series[-1] += value

    def _new_series(self, label_values: tuple[str, ...]) -> list[float]:
        if len(self._series) >= metrics.LABEL_SETS_MAX:
            label_values = tuple("_overflow" for _ in self.labels)
        return self._series.setdefault(label_values, [0.0] * (len(self.buckets) + 2))

    def series(self, *label_values: str) -> tuple[list[float], float]:
        """``(count per bucket, +Inf last; sum)`` of one label set (zeros if never observed)."""
        with self._lock:
            series = self._series.get(label_values)
            if series is None:
                return [0.0] * (len(self.buckets) + 1), 0.0
            return list(series[:-1]), series[-1]

    def count(self, *label_values: str) -> int:
        with self._lock:
            series = self._series.get(label_values)
            return 0 if series is None else int(sum(series[:-1]))

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        with self._lock:
            # (The items copied in one step: a `one_thread` histogram may gain a series meanwhile.)
            items = sorted((k, list(v)) for k, v in list(self._series.items()))
        for key, series in items:
            base = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.labels, key, strict=False))
            sep = "," if base else ""
            cumulative = 0.0
            for bound, count in zip(self.buckets, series[: len(self.buckets)], strict=True):  # then +Inf, sum
                cumulative += count
                lines.append(f'{self.name}_bucket{{{base}{sep}le="{bound:g}"}} {cumulative:g}')
            cumulative += series[len(self.buckets)]
            lines.append(f'{self.name}_bucket{{{base}{sep}le="+Inf"}} {cumulative:g}')
            labels = f"{{{base}}}" if base else ""
            lines.append(f"{self.name}_sum{labels} {series[-1]:.6f}")
            lines.append(f"{self.name}_count{labels} {cumulative:g}")
        return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


GRANTS = metrics.REGISTRY.counter("stockade_grants_total", "Leases granted (each with a new fencing token).")
RENEWALS = metrics.REGISTRY.counter("stockade_renewals_total", "Leases renewed.")
EXPIRIES = metrics.REGISTRY.counter("stockade_expiries_total", "Leases that expired without being released.")
WAITS = metrics.REGISTRY.counter("stockade_waits_total", "Acquires that had to wait in a scope's FIFO queue.")
LOCK_TIMEOUTS = metrics.REGISTRY.counter("stockade_lock_timeouts_total", "Acquires whose wait deadline passed.")
PROBLEMS = metrics.REGISTRY.counter(
    "stockade_request_rejections_total", "Requests answered with a problem document, by problem code.", ("code",)
)
# Gauges: set from counts the lease table keeps up to date anyway (lengths of its maps),
# at each scrape, so a scrape costs O(1) however many scopes there are.
LEASES_HELD = metrics.REGISTRY.gauge(
    "stockade_leases_held", "Leases in the lease table (a lease past its TTL counts until it is swept or replaced)."
)
WAITERS = metrics.REGISTRY.gauge("stockade_waiters", "Acquires waiting in a scope's FIFO queue right now.")
SCOPES = metrics.REGISTRY.gauge("stockade_scopes", "Scopes the coordinator keeps (each with its last issued token).")
WAIT_SECONDS = Histogram("stockade_wait_seconds", "Time queued acquires waited, until granted or timed out.")
REQUEST_SECONDS = Histogram(
    "stockade_request_seconds", "HTTP request latency, from the last byte read to the response written.",
    ("route", "method", "status"), one_thread=True,  # observed by the loop's thread alone (the app's `observe`)
)

COMMIT_SECONDS = Histogram(
    "stockade_commit_seconds", "Group-commit transactions, from BEGIN to COMMIT returned (its fsync included).",
    ("file",),
)


def render() -> str:
    lines = [line for h in (WAIT_SECONDS, REQUEST_SECONDS, COMMIT_SECONDS) for line in h.render()]
    return metrics.REGISTRY.render() + "\n".join(lines) + "\n"
