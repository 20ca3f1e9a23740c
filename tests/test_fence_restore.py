"""Restoring a user's SQLite file or a fenced directory from an older backup, then the floor (R4).

With a real coordinator (``stockade.connect("sqlite:///...?process=embedded")``) and its real
tokens: writes with token t, a backup, more writes with t+1..t+k, then the
backup is restored. The restored resource holds the old mark t, so a zombie's
old token looks current again: the control shows one accepted. After
``raise_high_waters(coord.fence_floors())`` none of the ``OLD_TOKENS`` old
tokens is accepted, and a new lease's token is.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stockade
from stockade.core.errors import InvalidArgument, StaleToken
from stockade.resources.files import FencedDirectory
from stockade.resources.files import open_floor_target as open_files_floor
from stockade.resources.sqlite_db import SQLiteFence
from stockade.resources.sqlite_db import open_floor_target as open_sqlite_floor
from stockade.testing.fences.sqlite_db import UPSERT, user_database

SCOPE = "orders"
OLD_TOKENS = 20  # tokens issued after the backup was taken and before the restore; the issue asks for >= 20


def issue(coord: stockade.Coordinator) -> Any:
    lease = coord.acquire(SCOPE, ttl_ms=10_000, keepalive=False)
    lease.release()
    return lease.token


class SQLiteTarget:
    def __init__(self, root: Path, coord: stockade.Coordinator) -> None:
        self.path, self.copy, self.coord = root / "user.db", root / "backup.db", coord
        user_database(self.path)

    def open(self) -> SQLiteFence:
        return SQLiteFence(self.path, keys=self.coord.verify_keys())

    def write(self, token: Any, value: bytes) -> None:
        with self.open() as fence, fence.fenced(token) as conn:
            conn.execute(UPSERT, (SCOPE, "k", value))

    def backup(self) -> None:
        source, target = sqlite3.connect(str(self.path)), sqlite3.connect(str(self.copy))
        source.backup(target)
        source.close()
        target.close()

    def restore(self) -> None:
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(self.copy, self.path)

    def floor(self) -> dict[str, int]:  # as `stockade floor sqlite:///...` opens it: by url, no keys
        with open_sqlite_floor(f"sqlite:///{self.path}", cluster_id=self.coord.cluster_id) as fence:
            return fence.raise_high_waters(self.coord.fence_floors())


class FilesTarget:
    def __init__(self, root: Path, coord: stockade.Coordinator) -> None:
        self.path, self.copy, self.coord = root / "files", root / "backup", coord

    def open(self) -> FencedDirectory:
        return FencedDirectory(self.path, keys=self.coord.verify_keys())

    def write(self, token: Any, value: bytes) -> None:
        with self.open() as directory:
            directory.write("k", value, token)

    def backup(self) -> None:
        shutil.copytree(self.path, self.copy, symlinks=True)

    def restore(self) -> None:
        shutil.rmtree(self.path)
        shutil.copytree(self.copy, self.path, symlinks=True)

    def floor(self) -> dict[str, int]:  # as `stockade floor file:///...` opens it: by url, no keys
        with open_files_floor(f"file://{self.path}", cluster_id=self.coord.cluster_id) as directory:
            return directory.raise_high_waters(self.coord.fence_floors())


TARGETS: dict[str, Callable[[Path, stockade.Coordinator], Any]] = {"sqlite-db": SQLiteTarget, "files": FilesTarget}


def accepted(target: Any, tokens: list[Any]) -> int:
    count = 0
    for token in tokens:
        try:
            target.write(token, b"zombie")
            count += 1
        except StaleToken:
            pass
    return count


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_a_restored_backup_accepts_old_tokens_until_the_floor_then_none(tmp_path: Path, kind: str) -> None:
    with stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded") as coord:
        target = TARGETS[kind](tmp_path, coord)
        first = issue(coord)
        target.write(first, b"t")
        target.backup()
        old = [issue(coord) for _ in range(OLD_TOKENS)]
        latest = issue(coord)
        target.write(latest, b"t+k")

        target.restore()
        # The control: on the restored copy the newest old token is accepted, as if it were current.
        assert accepted(target, [old[-1]]) == 1, "the restored backup should accept an old token (the control)"

        target.restore()
        assert target.floor() == {SCOPE: latest.value}
        assert accepted(target, [first, *old]) == 0, f"old tokens accepted after the floor (of {OLD_TOKENS + 1})"
        fresh = issue(coord)
        target.write(fresh, b"new")  # a new lease writes as usual


def test_the_floor_never_creates_a_resource_and_refuses_another_cluster(tmp_path: Path) -> None:
    for opener, url in ((open_sqlite_floor, f"sqlite:///{tmp_path}/missing.db"),
                        (open_files_floor, f"file://{tmp_path}/missing")):
        with pytest.raises(InvalidArgument):
            opener(url, cluster_id="feedfacefeedface")
    user_database(tmp_path / "user.db")
    open_sqlite_floor(f"sqlite:///{tmp_path}/user.db", cluster_id="feedfacefeedface").close()
    FencedDirectory(tmp_path / "files", keys="unsigned", cluster_id="feedfacefeedface").close()
    for opener, url in ((open_sqlite_floor, f"sqlite:///{tmp_path}/user.db"), (open_files_floor, f"file://{tmp_path}/files")):
        with pytest.raises(InvalidArgument, match="cluster"):
            opener(url, cluster_id="0000000000000001")
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "missing").exists()
