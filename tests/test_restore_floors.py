"""A restore never lowers a high-water mark (R4), whatever survived of the old store.

The scenario of the finding: a backup is taken, a scope is created after it
and written with tokens 1..4, then the old store is lost. Restoring with the
floors of only the scopes a caller happened to know (or none) left that
scope at 0, so a zombie's token-1 write was accepted. Now floors must cover
every scope: a `FenceFloors` (named scopes and a default for all others) or a
mapping its caller vouches for with ``floors_complete=True``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stockade.core.errors import InvalidArgument, StaleToken
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources.store import SQLiteStore, restore

CLUSTER = "0123456789abcdef"


def tok(value: int, scope: str) -> FencingToken:
    return FencingToken(CLUSTER, scope, value)


def lose(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def scenario(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    """A backup; afterwards "old" rises to 4 and "late" is created and rises to 4; then the store is lost."""
    path, backup_path = tmp_path / "store.db", tmp_path / "backup.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as store:
        store.put("old", "k", b"v", token=tok(2, "old"))
        store.backup(backup_path)
        for value in range(3, 5):
            store.put("old", "k", b"v", token=tok(value, "old"))
        for value in range(1, 5):
            store.put("late", "k", b"v", token=tok(value, "late"))
        marks = store.high_waters()
    lose(path)
    return path, backup_path, marks


def marks_lowered(path: Path, before: dict[str, int]) -> list[str]:
    with SQLiteStore(path, keys="unsigned") as store:
        return [s for s, mark in before.items() if store.high_water(s) < mark]


def zombie_writes_accepted(path: Path, marks: dict[str, int]) -> int:
    """Every token below each scope's last mark, written by a zombie: how many get in."""
    accepted = 0
    with SQLiteStore(path, keys="unsigned") as store:
        for scope, mark in marks.items():
            for value in range(1, mark):
                try:
                    store.put(scope, "k", b"zombie", token=tok(value, scope))
                    accepted += 1
                except StaleToken:
                    pass
    return accepted


def test_restore_with_a_missing_old_store_and_a_scope_created_after_the_backup_lowers_no_mark(tmp_path, capsys):
    path, backup_path, marks = scenario(tmp_path)
    # The coordinator names "old" (last issued 4) and has forgotten "late": its default floor
    # is above every token it issued for a scope it does not list.
    floors = FenceFloors({"old": 4}, default=4)
    report = restore(backup_path, path, fence_floors=floors, report_path=tmp_path / "report.json")
    lowered = marks_lowered(path, marks)
    zombies = zombie_writes_accepted(path, marks)
    with capsys.disabled():
        print(f"\n[figure] restore, old store missing, scope created after the backup: "
              f"marks lowered {len(lowered)} of {len(marks)}; zombie writes accepted {zombies}")
    assert lowered == [] and zombies == 0
    assert report.raised == {"old": (2, 4)} and report.default_floor == 4 and report.old_store == "missing"
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["raised"] == {"old": {"backup": 2, "after": 4}} and document["default_floor"] == 4
    with SQLiteStore(path, keys="unsigned") as store:
        assert store.high_water("late") == 4 and store.high_water("never-seen") == 4
        store.put("late", "k", b"current", token=tok(4, "late"))  # the current holder continues
        store.put("fresh", "k", b"v", token=tok(5, "fresh"))


@pytest.mark.parametrize("floors", [{}, {"old": 4}], ids=["empty", "names-only-known-scopes"])
def test_restore_refuses_floors_that_may_miss_a_scope_and_changes_nothing(tmp_path, floors, capsys):
    path, backup_path, _ = scenario(tmp_path)
    with pytest.raises(InvalidArgument) as info:
        restore(backup_path, path, fence_floors=floors, report_path=tmp_path / "report.json")
    assert info.value.field == "fence_floors"
    assert not path.exists() and not (tmp_path / "report.json").exists()
    with capsys.disabled():
        print(f"\n[figure] restore with fence_floors={floors}: refused ({type(info.value).__name__})")


def test_a_complete_mapping_is_taken_when_the_caller_vouches_for_it(tmp_path):
    path, backup_path, marks = scenario(tmp_path)
    report = restore(backup_path, path, fence_floors={"old": 4, "late": 4}, floors_complete=True,
                     report_path=tmp_path / "report.json")
    assert marks_lowered(path, marks) == [] and report.raised == {"old": (2, 4), "late": (0, 4)}


def test_old_store_marks_are_kept_when_the_floors_are_lower(tmp_path):
    """The old store is present: its marks count even where the coordinator's floors are lower."""
    path, backup_path = tmp_path / "store.db", tmp_path / "backup.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as store:
        store.put("a", "k", b"v", token=tok(2, "a"))
        store.backup(backup_path)
        store.put("a", "k", b"v", token=tok(4, "a"))
        store.put("b", "k", b"v", token=tok(7, "b"))
        marks = store.high_waters()
    report = restore(backup_path, path, fence_floors=FenceFloors({}, default=0), report_path=tmp_path / "r.json")
    assert marks_lowered(path, marks) == []
    assert report.raised == {"a": (2, 4), "b": (0, 7)}
    assert [(r.scope, r.token_value) for r in report.removed] == [("a", 4), ("b", 7)]


def test_the_default_floor_survives_a_second_restore(tmp_path):
    path, backup_path, marks = scenario(tmp_path)
    restore(backup_path, path, fence_floors=FenceFloors({"old": 4}, default=4), report_path=tmp_path / "r1.json")
    with SQLiteStore(path, keys="unsigned") as store:
        store.backup(tmp_path / "backup2.db")
    lose(path)
    report = restore(tmp_path / "backup2.db", path, fence_floors={}, floors_complete=True,
                     report_path=tmp_path / "r2.json")
    assert report.default_floor == 4 and marks_lowered(path, marks) == []


def test_fence_floors_validate():
    for bad in [({"a": -1}, 0), ({"a b": 1}, 0), ({"a": 1}, -1), ({"a": 1}, 2**63), ([("a", 1)], 0)]:
        with pytest.raises(InvalidArgument):
            FenceFloors(*bad)
    floors = FenceFloors({"b": 2, "a": 1}, default=9)
    assert (floors.floor("a"), floors.floor("zz")) == (1, 9)
    with pytest.raises(TypeError):
        floors.floors["a"] = 5  # read-only
