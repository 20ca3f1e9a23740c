"""Store files are private to their owner (mode 0600) whatever the umask.

The store file holds every value and idempotency key, its WAL and
shared-memory files hold the same bytes, and a backup or restore report
names scopes and keys: none of them may be readable by other local users.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stockade.core.tokens import FencingToken
from stockade.resources.store import SQLiteStore, restore

CLUSTER = "0123456789abcdef"


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_store_wal_shm_backup_and_report_are_0600_under_umask_022(tmp_path, umask_022):
    path = tmp_path / "store.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as store:
        store.put("a", "k", b"secret", token=FencingToken(CLUSTER, "a", 1))
        side = [Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert all(p.exists() for p in side)  # checked while open: WAL mode keeps them
        modes = {p.name: mode(p) for p in [path, *side]}
        store.backup(tmp_path / "backup.db")
    modes["backup.db"] = mode(tmp_path / "backup.db")
    restore(tmp_path / "backup.db", path, fence_floors={"a": 1}, floors_complete=True,
            report_path=tmp_path / "report.json")
    modes["store.db after restore"] = mode(path)
    modes["report.json"] = mode(tmp_path / "report.json")
    assert modes == {name: 0o600 for name in modes}, modes


def test_an_existing_file_keeps_its_owners_mode(tmp_path, umask_022):
    path = tmp_path / "store.db"
    SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned").close()
    os.chmod(path, 0o640)  # the operator chose group read
    SQLiteStore(path, keys="unsigned").close()
    assert mode(path) == 0o640
