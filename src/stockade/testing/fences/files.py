"""The fence harness over a fenced directory (`stockade.resources.files`).

A unit is one batch on one scope: ``unit.write(key, value)`` stages the file
``key``; the batch is applied when the unit ends. The suite's R6 and S20 tests
see whole batches: the scope's lock is held from the check to the last rename.
What they do not see is a crash in the middle of a multi-file batch (files are
atomic one by one; tests/test_fence_files.py covers kill -9 per file).

Controls: ``fencing-off`` and ``strict-greater`` swap the directory's
``fence_rule``; ``check-then-write`` reads the mark in one step, judges it,
calls ``between_check_and_write``, then writes each file in a batch of its own
whose rule trusts the earlier check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.fence import Accept, Reject, decide
from stockade.keys import FixedKeys
from stockade.resources._inputs import coerce_token
from stockade.resources._observe import reject
from stockade.resources.files import FencedDirectory
from stockade.testing.fences.sqlite_db import trusting
from stockade.testing.mutants import accept_everything, reject_equal

SCOPES = ("a", "b")


class FilesHarness:
    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> None:
        self.path, self.cluster_id, self.keys, self.mutant = path, cluster_id, keys, mutant
        self.directory = self._open()
        if mutant == "fencing-off":
            self.directory.fence_rule = accept_everything
        elif mutant == "strict-greater":
            self.directory.fence_rule = reject_equal
        else:
            assert mutant in (None, "check-then-write"), mutant

    def _open(self) -> FencedDirectory:
        return FencedDirectory(self.path, keys=self.keys, cluster_id=self.cluster_id,
                               file_bytes_max=self.value_bytes_max)

    def fenced(self, scope: str, token: Any) -> Any:
        if self.mutant == "check-then-write":
            return self._check_then_write(scope, token)
        return self.directory.batch(token, scope=scope)

    @contextmanager
    def _check_then_write(self, scope: str, token: Any) -> Iterator[Any]:
        checked = coerce_token(token)
        decision = decide(checked, cluster=self.cluster_id, scope=scope, high_water=self.directory.high_water(scope))
        if isinstance(decision, Reject):
            reject(decision, resource=self.directory.resource, cluster=self.cluster_id, token=checked,
                   scope=scope, key=None)
        assert isinstance(decision, Accept)
        accepted = decision
        if self.between_check_and_write is not None:
            self.between_check_and_write()
        harness = self

        class EachStepAlone:
            def write(self, key: str, value: bytes) -> None:
                with harness._open() as directory:
                    directory.fence_rule = trusting(accepted)
                    directory.write(key, value, checked, scope=scope)

            def read(self, key: str) -> bytes | None:
                return harness.read(scope, key)

        yield EachStepAlone()

    def read(self, scope: str, key: str) -> bytes | None:
        return self.directory.read(key, scope=scope)

    def high_water(self, scope: str) -> int:
        return self.directory.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self.directory.raise_high_waters(floors, default=default)

    def state(self) -> Any:
        d = self.directory
        return (d.high_waters(), d.default_floor(),
                {s: {n: d.read(n, scope=s) for n in d.names(scope=s)} for s in SCOPES})

    def clone(self) -> FilesHarness:
        other = FilesHarness(self.path, self.cluster_id, self.keys, self.mutant)
        other.between_check_and_write = self.between_check_and_write
        return other

    def close(self) -> None:
        self.directory.close()


def make_files_harness(path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> FilesHarness:
    return FilesHarness(path / "files", cluster_id, keys, mutant)
