"""In-process metrics with a Prometheus text rendering. Bounded label sets.

The fenced store counts rejections here (R5); the HTTP server renders
`REGISTRY` at ``/metrics``.
"""

from __future__ import annotations

import threading

__all__ = ["Counter", "Gauge", "Registry", "REGISTRY", "LABEL_SETS_MAX"]

LABEL_SETS_MAX = 10_000  # per metric; further label sets fold into one overflow series


class Counter:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.help_text = help_text
        self.labels = labels
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        # On every request: a counter without labels (most of them) builds no key.
        key = tuple([str(labels.get(name, "")) for name in self.labels]) if self.labels else ()
        with self._lock:
            if key in self._values:  # the usual case, without a call
                self._values[key] += amount
                return
            if len(self._values) >= LABEL_SETS_MAX:
                key = tuple("_overflow" for _ in self.labels)
            self._values[key] = self._values.get(key, 0.0) + amount

    def inc_series(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        """`inc` of the label set whose values, in label order, are ``key`` (a hot path keeps its key)."""
        with self._lock:
            if key in self._values:  # the usual case, without a call
                self._values[key] += amount
                return
            if len(self._values) >= LABEL_SETS_MAX:
                key = tuple("_overflow" for _ in self.labels)
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        key = tuple(str(labels.get(name, "")) for name in self.labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} counter"]
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.labels, key, strict=False))
            lines.append(f"{self.name}{{{pairs}}} {value:g}" if pairs else f"{self.name} {value:g}")
        return lines


class Gauge:
    """A value that goes up and down, set by its owner (no labels: one series)."""

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help_text = help_text
        self._value = 0.0

    def set(self, value: float) -> None:
        self._value = float(value)  # one float store: atomic under the GIL, no lock needed

    def value(self) -> float:
        return self._value

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} gauge", f"{self.name} {self._value:g}"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._metrics[name] = Counter(name, help_text, labels)
            if not isinstance(metric, Counter):
                raise TypeError(f"{name} is registered as a {type(metric).__name__}")
            return metric

    def gauge(self, name: str, help_text: str) -> Gauge:
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._metrics[name] = Gauge(name, help_text)
            if not isinstance(metric, Gauge):
                raise TypeError(f"{name} is registered as a {type(metric).__name__}")
            return metric

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics.values())
        return "\n".join(line for m in metrics for line in m.render()) + "\n"


REGISTRY = Registry()
# R5: labelled by reason only. The reasons are a short fixed list (stale, wrong-scope,
# wrong-cluster, ...), so the series stay few however many scopes a client makes up, and
# no rejection is ever folded into an overflow series. The scope is in the log record.
FENCE_REJECTIONS = REGISTRY.counter(
    "stockade_fence_rejections_total", "Writes rejected by a resource's fence rule, by reason.", ("reason",)
)
FENCE_REJECTION_LOGS_SUPPRESSED = REGISTRY.counter(
    "stockade_fence_rejection_logs_suppressed_total",
    "Fence rejections counted but not logged one by one (a repeat, or past the log's bound; see the summary "
    "records).",
)
