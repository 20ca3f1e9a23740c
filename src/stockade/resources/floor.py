"""Raise a resource's high-water marks to the coordinator's floors (R4), after a failover or a restore.

A resource that fails over to a replica, or is restored from a backup, may
come back with high-water marks (HWMs) older than the tokens already issued:
an old token would look current again. The fix needs no guess: the
coordinator knows the last token it issued for every scope
(`Coordinator.fence_floors`, embedded and over HTTP), and no write was ever
admitted with a higher one. Raising every scope's mark to that floor before
the resource takes writes again makes every token of an earlier lease stale
there, whatever the resource lost.

    floors = coord.fence_floors()
    with open_floor_target("postgresql://db1/app", cluster_id=coord.cluster_id) as target:
        report = raise_to_floors(target, floors)

``stockade floor RESOURCE_URL`` does the same from the shell and prints what it
raised. Raising only ever moves marks up, so running it twice, or on a
resource that lost nothing, is harmless; what it cannot undo is a write that a
stale token made *before* it ran, so run it before the promoted replica or the
restored copy takes writes.

Resources are opened by url (`FLOOR_TARGETS`, in `stockade.resources.registry`): ``sqlite:///path`` (stockade's
own store, or a user's database fenced by `stockade.resources.sqlite_db`),
``postgresql://...``, ``redis://...`` and ``file:///dir`` (a fenced directory).
Each adapter folder offers ``open_floor_target(url, *, cluster_id)``, imported
only when its scheme is used, so the base install needs none of their drivers.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stockade.core.errors import InvalidArgument
from stockade.core.values import FenceFloors
from stockade.resources.registry import FLOOR_TARGETS, load

__all__ = ["FloorTarget", "FloorChange", "FloorReport", "FLOOR_TARGETS", "open_floor_target", "raise_to_floors",
           "redact_url"]


@runtime_checkable
class FloorTarget(Protocol):
    """What `raise_to_floors` needs of a resource: read its marks, raise them (R4), close."""

    def high_waters(self) -> dict[str, int]:
        """Every scope's mark that the resource knows of (its own, or the default floor if higher)."""
        ...

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise, never lower, atomically; ``default`` for every scope not named. The named scopes' marks after."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class FloorChange:
    """One scope whose mark the floor raised."""

    scope: str
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class FloorReport:
    """What `raise_to_floors` did (or, with ``dry_run``, would do).

    Attributes:
        raised: the scopes whose own mark went up, in scope order.
        scopes: how many scopes were named by the floors or had a mark.
        default: the floor now set for every scope not named (the coordinator's
            floor for scopes it has forgotten or never issued).
        dry_run: nothing was changed.
    """

    raised: tuple[FloorChange, ...]
    scopes: int
    default: int
    dry_run: bool


def raise_to_floors(target: FloorTarget, floors: FenceFloors, *, dry_run: bool = False) -> FloorReport:
    """Raise every scope of ``target`` to at least the coordinator's floor for it, in one atomic step.

    Args:
        target: the resource (see `open_floor_target`).
        floors: ``coord.fence_floors()``: the last issued token of every scope, and a default.
        dry_run: compute the report without changing anything.

    Raises:
        InvalidArgument: ``floors`` is not a `FenceFloors`.
        BackendUnavailable: the resource failed; a raise is atomic, so nothing or everything changed.
    """
    if not isinstance(floors, FenceFloors):
        raise InvalidArgument("floors", "must be the coordinator's FenceFloors (coord.fence_floors())")
    before = target.high_waters()
    scopes = sorted(set(before) | set(floors.floors))
    wanted = {s: max(floors.floor(s), floors.default) for s in scopes}
    if dry_run:
        after = {s: max(before.get(s, 0), wanted[s]) for s in scopes}
    else:
        after = target.raise_high_waters(dict(floors.floors), default=floors.default)
        after = {s: after.get(s, max(before.get(s, 0), wanted[s])) for s in scopes}
    raised = tuple(FloorChange(s, before.get(s, 0), after[s]) for s in scopes if after[s] > before.get(s, 0))
    return FloorReport(raised=raised, scopes=len(scopes), default=floors.default, dry_run=dry_run)


def open_floor_target(url: str, *, cluster_id: str) -> FloorTarget:
    """Open the resource ``url`` names, for `raise_to_floors`.

    Args:
        url: a url with a scheme of `FLOOR_TARGETS`.
        cluster_id: the coordinator's cluster; a resource that records its
            cluster (stockade's store) must match it.

    Raises:
        InvalidArgument: not a url, an unknown scheme, or a resource of another cluster.
        BackendUnavailable: the resource cannot be opened, or its adapter's driver is not installed.
    """
    scheme, sep, _ = url.partition("://") if isinstance(url, str) else ("", "", "")
    if not sep:
        raise InvalidArgument("resource", "must be a url such as postgresql://host/db or sqlite:///path/app.db")
    opener = FLOOR_TARGETS.get(scheme)
    if opener is None:
        raise InvalidArgument("resource", f"unknown resource scheme {scheme!r}; supported: "
                                          f"{', '.join(sorted(FLOOR_TARGETS))}")
    target: FloorTarget = load(opener)(url, cluster_id=cluster_id)
    return target


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for printing)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
