"""A toy fence adapter: a dict kept in one JSON file, fenced with a lock file. It shows the seam.

It is what a third party writes to fence a resource of their own, and it is
added to the project as this folder and one line of
`stockade.resources.registry.FENCE_TARGETS` (its conformance descriptor,
`stockade.testing.toy_fence.conformance.FENCE_TARGET`); the shared fence
suites then run on it as on every adapter. Not for production: the whole file
is rewritten by every unit, and not synced to disk.

    fence = JsonFence("/var/lib/app/state.json", cluster_id=coord.cluster_id, keys=coord.verify_keys())
    with fence.fenced(lease.token, scope="reports") as unit:
        unit.write("daily", b"...")

The file holds ``{"cluster_id", "verified", "default_floor", "marks": {scope: n}, "data": {scope: {key:
hex}}}``. A unit holds ``<file>.lock`` (``flock``, exclusive) from its check to the replace of the file
(write a sibling, rename; not fsync'd: a crash may lose the last units, never a mark
without its data), so the check and the apply are one step (R1) and a higher token waits
for an open lower unit (R6). The mark is judged by `stockade.resources._admit` (R2 -> R1, R5), raised
to the default floor (R4); verification is `stockade.resources._verify` (L2: ``keys=None`` is refused,
and a file that verified once refuses ``keys="unsigned"``).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.fence import FenceRule, decide
from stockade.core.limits import VALUE_BYTES_MAX, validate_key, validate_scope, validate_value
from stockade.core.tokens import FencingToken
from stockade.resources._admit import admit_mark, effective_mark
from stockade.resources._inputs import check_floors_and_default, coerce_token
from stockade.resources._verify import Verification, refuse_unsigned_after_signed

__all__ = ["JsonFence", "JsonUnit"]


class JsonUnit:
    """One fenced unit's writes to one scope, applied when the block ends."""

    def __init__(self, data: dict[str, str], value_bytes_max: int) -> None:
        self.data = data
        self._max = value_bytes_max

    def write(self, key: str, value: bytes) -> None:
        """Write ``key`` (applied with the unit). Raises `InvalidArgument` on a bad key or value."""
        self.data[validate_key(key)] = validate_value(value, self._max).hex()

    def read(self, key: str) -> bytes | None:
        """``key`` as this unit sees it, or None."""
        value = self.data.get(key)
        return None if value is None else bytes.fromhex(value)


class JsonFence:
    """A fenced dict in one JSON file (see the module docstring).

    Args:
        path: the JSON file (created with ``cluster_id`` if missing).
        cluster_id: the coordinator cluster whose tokens it trusts.
        keys: the coordinator's verification keys, or ``"unsigned"`` (L2: None is refused).
        value_bytes_max: the largest value a unit writes.

    Raises:
        InvalidArgument: no keys, or a file of another cluster, or ``"unsigned"`` on a file that verified.
    """

    def __init__(self, path: str | Path, *, cluster_id: str, keys: object, value_bytes_max: int = VALUE_BYTES_MAX
                 ) -> None:
        self.path = Path(path)
        self.cluster_id = cluster_id
        self.value_bytes_max = value_bytes_max
        self.resource = f"toy-json:{self.path}"
        self.fence_rule: FenceRule = decide  # the comparison; a control of the conformance suite swaps it
        self.verification = Verification()
        self.verification.use_keys(keys, cluster_id)
        with self._held() as state:
            if state["cluster_id"] != cluster_id:
                raise InvalidArgument("cluster_id", f"{self.path} is fenced for cluster {state['cluster_id']}")
            refuse_unsigned_after_signed(self.resource, state["verified"], keys)
            if self.verification.verifies and not state["verified"]:
                state["verified"] = True
                self._save(state)

    @contextmanager
    def _held(self) -> Iterator[dict[str, Any]]:
        """The file's state, under its lock (a fresh open file: threads and processes alike wait)."""
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_bytes())
            except FileNotFoundError:
                state = {"cluster_id": self.cluster_id, "verified": False, "default_floor": 0, "marks": {},
                         "data": {}}
            yield state
        finally:
            os.close(fd)

    def _save(self, state: dict[str, Any]) -> None:
        temporary = self.path.with_name(f"{self.path.name}.tmp")
        with open(temporary, "wb") as out:
            out.write(json.dumps(state, sort_keys=True).encode())
        os.replace(temporary, self.path)  # no fsync (a toy): a crash may lose the last units, marks and data alike

    @contextmanager
    def fenced(self, token: FencingToken | str, *, scope: str | None = None,
               rule: FenceRule | None = None) -> Iterator[JsonUnit]:
        """Admit ``token`` on ``scope`` and apply the unit's writes with the new mark when the block ends.

        Raises:
            StaleToken, TokenMismatch: refused (counted, logged); nothing changes.
            InvalidArgument: a bad token, scope, key or value; nothing changes.
        """
        checked = coerce_token(token)
        scope = validate_scope(checked.scope if scope is None else scope)
        with self._held() as state:
            mark = admit_mark(checked, scope=scope, cluster=self.cluster_id, resource=self.resource,
                              high_water=effective_mark(state["marks"].get(scope), state["default_floor"]),
                              rule=self.fence_rule if rule is None else rule,
                              forged=self.verification.forged(checked))
            unit = JsonUnit(dict(state["data"].get(scope, {})), self.value_bytes_max)
            yield unit  # an exception here leaves the file as it was
            state["marks"][scope] = mark
            state["data"][scope] = unit.data
            self._save(state)

    def read(self, scope: str, key: str) -> bytes | None:
        """``key`` of ``scope`` as committed, or None."""
        with self._held() as state:
            return JsonUnit(state["data"].get(validate_scope(scope), {}), self.value_bytes_max).read(key)

    def high_water(self, scope: str) -> int:
        """The scope's mark: its own raised to the default floor (0 if neither)."""
        with self._held() as state:
            return effective_mark(state["marks"].get(validate_scope(scope)), state["default_floor"])

    def high_waters(self) -> dict[str, int]:
        """Every scope with a mark of its own, with its effective mark."""
        with self._held() as state:
            return {s: effective_mark(own, state["default_floor"]) for s, own in state["marks"].items()}

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        """Raise, never lower, in one replace of the file (R4): the named scopes' marks after.

        Raises:
            InvalidArgument: a bad scope or floor (nothing changes).
        """
        checked, default = check_floors_and_default(floors, default)
        with self._held() as state:
            state["default_floor"] = max(state["default_floor"], default)
            for scope, floor in checked.items():
                state["marks"][scope] = max(state["marks"].get(scope, 0), floor)
            self._save(state)
            return {s: effective_mark(state["marks"][s], state["default_floor"]) for s in checked}

    def state(self) -> Any:
        """The whole file's content (for the conformance suite's before/after comparisons)."""
        with self._held() as state:
            return {k: v for k, v in state.items() if k != "verified"}
