"""Telemetry: the user's callbacks on a lease's life, and OpenTelemetry spans if it is installed.

Shared by the sync and async clients (not generated). A hook is a plain
function, called on whichever thread or task made the event happen (a renewal:
the keepalive's task, or one of the sync client's few renewal threads; a loss
the keepalive or the deadline marked: the loop, or the sync client's callback
thread), so it must be quick and must not block. A hook that raises is logged and
ignored: telemetry never decides whether a lease is held.

OpenTelemetry is optional and never a dependency: ``opentelemetry-api`` is
imported on first use, and without it there are no spans. With it, every
lease is one span ``stockade.lease`` from grant to release (events
``stockade.renew`` and ``stockade.lost``; status ERROR when lost), and every
fence rejection a span ``stockade.fence_rejected``. With the API but no SDK
configured, the spans are the API's no-op spans.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stockade.core.errors import FenceRejected, InvalidArgument

__all__ = ["Hooks", "LeaseTelemetry", "call_hook", "lease_telemetry", "rejected"]

log = logging.getLogger("stockade.client")

LeaseHook = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Callbacks for the user's telemetry; each optional, each given one argument.

    Pass to ``stockade.connect(url, hooks=...)`` (the lease hooks) and to
    ``stockade.open_store(url, hooks=...)`` (``on_reject``).

    Attributes:
        on_grant: ``(lease)``: a lease was granted (before any keepalive).
        on_renew: ``(lease)``: a renewal succeeded; ``lease.remaining_ms`` is the new margin.
        on_lost: ``(lease)``: the lease was marked lost; ``lease.lost_cause`` says why.
            Called once, before the body of its ``lock()`` block is cancelled (async).
        on_release: ``(lease)``: the lease was given back (lost or not; called once).
        on_reject: ``(error)``: a store refused a write by the fence rule
            (a `stockade.FenceRejected`: `StaleToken` or `TokenMismatch`),
            before the error is raised to the writer.

    Raises:
        InvalidArgument: a hook that is not callable.
    """

    on_grant: LeaseHook | None = None
    on_renew: LeaseHook | None = None
    on_lost: LeaseHook | None = None
    on_release: LeaseHook | None = None
    on_reject: Callable[[FenceRejected], None] | None = None

    def __post_init__(self) -> None:
        for name in ("on_grant", "on_renew", "on_lost", "on_release", "on_reject"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise InvalidArgument(name, f"must be callable or None, got {type(hook).__name__}")


NO_HOOKS = Hooks()


def validate_hooks(hooks: object) -> Hooks:
    if hooks is None:
        return NO_HOOKS
    if not isinstance(hooks, Hooks):
        raise InvalidArgument("hooks", f"must be a stockade.client.Hooks, got {type(hooks).__name__}")
    return hooks


def call_hook(name: str, hook: Callable[[Any], None] | None, value: object) -> None:
    """Call ``hook(value)``; an exception from it is logged, never raised."""
    if hook is None:
        return
    try:
        hook(value)
    except Exception:  # noqa: BLE001 - the user's telemetry must not break the lease
        log.exception("hook %s raised; ignored", name)


# -- OpenTelemetry, when installed ----------------------------------------------------------

_UNSET: Any = object()
_tracer: Any = _UNSET


def _otel_tracer() -> Any:
    """The tracer of ``opentelemetry-api``, imported once on first use; None without it."""
    global _tracer
    if _tracer is _UNSET:
        try:
            trace = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _tracer = None
        else:
            _tracer = trace.get_tracer("stockade")
    return _tracer


def _otel(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - tracing must not break the lease either
        log.exception("OpenTelemetry call failed; ignored")


def _error_status(description: str) -> Any:
    trace = importlib.import_module("opentelemetry.trace")
    return trace.Status(trace.StatusCode.ERROR, description)


class LeaseTelemetry:
    """One lease's hooks and span. Each event is reported at most once (renewals: each)."""

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._span: Any = None

    def granted(self, lease: Any) -> None:
        tracer = _otel_tracer()
        if tracer is not None:
            def start() -> None:
                self._span = tracer.start_span("stockade.lease", attributes=_lease_attributes(lease))
            _otel(start)
        call_hook("on_grant", self._hooks.on_grant, lease)

    def renewed(self, lease: Any) -> None:
        span = self._span
        if span is not None:
            _otel(lambda: span.add_event("stockade.renew", {"stockade.remaining_ms": lease.remaining_ms}))
        call_hook("on_renew", self._hooks.on_renew, lease)

    def lost(self, lease: Any) -> None:
        span = self._span
        if span is not None:
            def mark() -> None:
                span.add_event("stockade.lost", {"stockade.cause": lease.lost_cause})
                span.set_status(_error_status(f"lease lost: {lease.lost_cause}"))
            _otel(mark)
        call_hook("on_lost", self._hooks.on_lost, lease)

    def released(self, lease: Any) -> None:
        span, self._span = self._span, None
        if span is not None:
            _otel(span.end)
        call_hook("on_release", self._hooks.on_release, lease)


class _Silent(LeaseTelemetry):
    """No lease hooks and no OpenTelemetry: nothing to report. One instance serves every such lease."""

    def granted(self, lease: Any) -> None:
        pass

    renewed = lost = released = granted


_SILENT = _Silent(NO_HOOKS)


def lease_telemetry(hooks: Hooks) -> LeaseTelemetry:
    """A new lease's telemetry: its own when there is a hook or a tracer to report to, else the silent one."""
    if hooks is NO_HOOKS and (_tracer if _tracer is not _UNSET else _otel_tracer()) is None:
        return _SILENT
    return LeaseTelemetry(hooks)


def _lease_attributes(lease: Any) -> dict[str, object]:
    return {
        "stockade.scope": lease.scope,
        "stockade.token": lease.token.value,
        "stockade.cluster_id": lease.token.cluster,
        "stockade.holder": lease.holder,
        "stockade.ttl_ms": lease.ttl_ms,
    }


def rejected(hooks: Hooks, error: FenceRejected) -> None:
    """Report a store's fence rejection to the hook and as a span; never raises."""
    tracer = _otel_tracer()
    if tracer is not None:
        def record() -> None:
            token = getattr(error, "token", None)
            attributes: dict[str, object] = {"stockade.reason": error.reason}
            if token is not None and hasattr(token, "value"):
                attributes.update({"stockade.scope": token.scope, "stockade.token": token.value})
            high_water = getattr(error, "high_water", None)
            if isinstance(high_water, int):
                attributes["stockade.high_water"] = high_water
            span = tracer.start_span("stockade.fence_rejected", attributes=attributes)
            span.set_status(_error_status(str(error)))
            span.end()
        _otel(record)
    call_hook("on_reject", hooks.on_reject, error)
