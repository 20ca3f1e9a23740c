"""One descriptor per fence adapter: how to open its harness, and each optional capability or why it lacks it.

The fence suites (`stockade.testing.conformance.fence` and its classes:
``fence_partial``, ``fence_retry``, ``fence_keys``, ``fence_paused``,
``fence_isolation``) drive an adapter through one harness. What differs from one
adapter to the next is said once, here, in a `FenceTarget`:

    FENCE_TARGET = FenceTarget(
        name="toy-json", open=make_harness, keyed=keyed,
        partial_failures=PartialFailures(refused=(...), injected=NotApplicable("...")),
        paused=NotBounded("..."), operation_ids="...", isolation="...", outsiders="...",
    )

and the resource registry names it (`stockade.resources.registry.FENCE_TARGETS`,
``name -> "module:NAME"``, imported on use), so a new adapter is its folder and
one registry line: `fence_targets` enumerates the registry, and
tests/test_fence_conformance.py runs every suite over what it finds. A
capability is True (the adapter offers it; its class runs) or a sentence saying
why it does not apply (shown as the skip reason); never absent, never silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.keys import FixedKeys
from stockade.testing.conformance.fence_partial import PartialFailures
from stockade.testing.conformance.fence_paused import NotBounded, PausedBound

__all__ = ["FenceTarget", "Opener", "KeyedOpener", "fence_targets", "uncovered_floor_schemes"]

#: ``(directory, cluster_id, keys, mutant) -> harness`` on a fresh, empty resource in ``directory``
#: (`stockade.testing.conformance.fence.FenceHarness`); ``mutant`` is None or a control's name.
Opener = Callable[[Path, str, FixedKeys, "str | None"], Any]

#: ``(directory, name) -> context manager of an opener`` for the L2 suite
#: (`stockade.testing.conformance.fence_keys.OpenKeyed`): it owns the test's resource.
KeyedOpener = Callable[[Path, str], AbstractContextManager[Any]]


def _offered_or_why(field: str, value: object) -> None:
    if value is True or (isinstance(value, str) and value.strip()):
        return
    raise ValueError(f"{field}: True, or a sentence saying why the adapter does not offer it (got {value!r})")


@dataclass(frozen=True)
class FenceTarget:
    """One fence adapter as the conformance suites see it.

    Attributes:
        name: the target's name in test ids (``postgres-async``, ``files``, ...).
        open: its harness opener (`Opener`); it accepts every control of
            `stockade.testing.conformance.fence.CONTROLS`.
        keyed: its L2 opener (`KeyedOpener`).
        partial_failures: how a later write of its unit fails, or why a kind does not apply.
        paused: its bound on a writer paused inside its unit (`PausedBound`), or why it has none (`NotBounded`).
        operation_ids: True (its harness has ``fenced_once``: the retry suite runs), or why not.
        isolation: True (``fenced_after_read``: the floor raised mid-transaction class runs), or why not.
        outsiders: True (``outsider``: the class of a role that may only connect), or why not.
        floors: the ``"module:function"`` of `stockade.resources.registry.FLOOR_TARGETS` that floors
            this target's adapter by url, or None (every floor target needs at least one fence target).
        shared_core: a second front end over a core another target runs at full size: the long
            counts run at a fifth by default.
        refused_none_before_l2: the adapter refused ``keys=None`` even before L2 (the L2 control
            then fails no L2 test on it but the memory one).
    """

    name: str
    open: Opener
    keyed: KeyedOpener
    partial_failures: PartialFailures
    paused: PausedBound | NotBounded
    operation_ids: bool | str
    isolation: bool | str
    outsiders: bool | str
    floors: str | None = None
    shared_core: bool = False
    refused_none_before_l2: bool = False

    def __post_init__(self) -> None:
        if not self.name or not callable(self.open) or not callable(self.keyed):
            raise ValueError("a fence target has a name, a harness opener and an L2 opener")
        if not isinstance(self.partial_failures, PartialFailures):
            raise ValueError(f"{self.name}: partial_failures must be a PartialFailures")
        if not isinstance(self.paused, PausedBound | NotBounded):
            raise ValueError(f"{self.name}: paused must be a PausedBound or a NotBounded")
        for field in ("operation_ids", "isolation", "outsiders"):
            _offered_or_why(f"{self.name}.{field}", getattr(self, field))


def fence_targets(registry: Mapping[str, str] | None = None) -> dict[str, FenceTarget]:
    """Every registered fence target by name, each loaded from its ``"module:NAME"``.

    Args:
        registry: ``name -> "module:NAME"`` (default: `stockade.resources.registry.FENCE_TARGETS`).

    Raises:
        ValueError: an entry names something that is not a `FenceTarget`, or one of another name.
    """
    from stockade.resources.registry import FENCE_TARGETS, load

    found: dict[str, FenceTarget] = {}
    for name, where in (FENCE_TARGETS if registry is None else registry).items():
        target = load(where)
        if not isinstance(target, FenceTarget) or target.name != name:
            raise ValueError(f"{where} is not the FenceTarget {name!r}")
        found[name] = target
    return found


def uncovered_floor_schemes(floor_targets: Mapping[str, str], targets: Iterable[FenceTarget]) -> set[str]:
    """The schemes of ``floor_targets`` (`FLOOR_TARGETS`) whose opener no fence target names (empty: all proved)."""
    named = {target.floors for target in targets}
    return {scheme for scheme, opener in floor_targets.items() if opener not in named}
