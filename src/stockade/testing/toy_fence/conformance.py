"""The toy fence's conformance descriptor: its harness, its L2 opener and its capabilities, or why it lacks each.

Named by one line of `stockade.resources.registry.FENCE_TARGETS` (``"toy-json"``); the shared fence
suites run on it through `stockade.testing.conformance.fence_target.fence_targets`. The controls:
``fencing-off`` and ``strict-greater`` swap the fence's rule (`stockade.testing.mutants`);
``check-then-write`` judges the mark in one locked step, calls ``between_check_and_write``, then applies
each write in a unit of its own whose rule trusts the earlier check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.fence import Accept, FenceDecision, Reject, decide
from stockade.core.signing import Keyring
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, save_keyring
from stockade.resources._inputs import coerce_token
from stockade.resources._observe import reject
from stockade.testing.conformance.fence import CLUSTER
from stockade.testing.conformance.fence_partial import FailingWrite, NotApplicable, PartialFailures
from stockade.testing.conformance.fence_paused import NotBounded
from stockade.testing.conformance.fence_target import FenceTarget
from stockade.testing.mutants import accept_everything, reject_equal
from stockade.testing.toy_fence import JsonFence

__all__ = ["ToyHarness", "make_harness", "keyed", "FENCE_TARGET"]


class ToyHarness:
    """The toy fence over one JSON file, as `stockade.testing.conformance.fence.FenceHarness`."""

    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, path: Path, cluster_id: str, keys: object, mutant: str | None) -> None:
        self.path, self.cluster_id, self.keys, self.mutant = path, cluster_id, keys, mutant
        self.fence = JsonFence(path, cluster_id=cluster_id, keys=keys, value_bytes_max=self.value_bytes_max)
        if mutant == "fencing-off":
            self.fence.fence_rule = accept_everything
        elif mutant == "strict-greater":
            self.fence.fence_rule = reject_equal
        else:
            assert mutant in (None, "check-then-write"), mutant

    def fenced(self, scope: str, token: Any) -> Any:
        if self.mutant == "check-then-write":
            return self._check_then_write(scope, token)
        return self.fence.fenced(token, scope=scope)

    @contextmanager
    def _check_then_write(self, scope: str, token: Any) -> Iterator[Any]:
        checked = coerce_token(token)
        decision = decide(checked, cluster=self.cluster_id, scope=scope, high_water=self.fence.high_water(scope))
        if isinstance(decision, Reject):
            reject(decision, resource=self.fence.resource, cluster=self.cluster_id, token=checked, scope=scope,
                   key=None)
        assert isinstance(decision, Accept)
        if self.between_check_and_write is not None:
            self.between_check_and_write()

        def trust(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
            return Accept(max(high_water, decision.new_high_water))  # the bug: believe the earlier check

        harness = self

        class EachStepAlone:
            def write(self, key: str, value: bytes) -> None:
                with harness.fence.fenced(checked, scope=scope, rule=trust) as unit:
                    unit.write(key, value)

            def read(self, key: str) -> bytes | None:
                return harness.read(scope, key)

        yield EachStepAlone()

    def read(self, scope: str, key: str) -> bytes | None:
        return self.fence.read(scope, key)

    def high_water(self, scope: str) -> int:
        return self.fence.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self.fence.raise_high_waters(floors, default=default)

    def state(self) -> Any:
        return self.fence.state()

    def clone(self) -> ToyHarness:
        other = ToyHarness(self.path, self.cluster_id, self.keys, self.mutant)
        other.between_check_and_write = self.between_check_and_write
        return other

    def close(self) -> None:
        pass


def make_harness(directory: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> ToyHarness:
    """A fresh JSON file in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return ToyHarness(directory / "state.json", cluster_id, keys, mutant)


@contextmanager
def keyed(directory: Path, name: str) -> Iterator[Callable[..., ToyHarness]]:
    """The L2 opener: the test's one JSON file, opened with ``keys`` as given (the toy has no discovery)."""

    def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> ToyHarness:
        directory.mkdir(parents=True, exist_ok=True)
        for file_name, keyring in beside:
            save_keyring(directory / file_name, keyring)
        return ToyHarness(directory / "state.json", CLUSTER, keys, None)

    yield open_keyed


def _oversize_key(harness: Any, unit: Any, key: str) -> None:
    unit.write("k" * 2000, b"x")


FENCE_TARGET = FenceTarget(
    name="toy-json", open=make_harness, keyed=keyed,
    partial_failures=PartialFailures(
        refused=(FailingWrite("a-key-over-1-KiB", _oversize_key, (InvalidArgument,)),),
        injected=NotApplicable("the unit is kept in memory and the file replaced once (rename) when the block "
                               "ends: no point between its writes reaches the file"),
    ),
    paused=NotBounded("a unit holds the file's flock from its check to its rename: a newer unit waits as long "
                      "as the writer is paused"),
    operation_ids="no operation ids: a toy",
    isolation="no snapshot: the check and the replace happen under the file's lock",
    outsiders="no roles but the file system's: whoever may open the lock file may lock it",
)
