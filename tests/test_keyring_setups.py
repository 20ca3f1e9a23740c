"""L2 in the eight keyring setups of the finding: a forged max-value token is accepted in 0 of 8.

The forgery is ``stk1.<cluster>.<2**63-1>.<scope>``: the right cluster and scope, the largest
value, no MAC. Each setup opens a resource the way a user would and tries it; the setup counts as
accepted when the write went through. Every setup must refuse to open or verify (0 of 8); the
control, `legacy_keys` (the behaviour before L2: keys=None meant unsigned, discovery that found none
or several keyrings, or lost its keyring past the first 16 files, opened unsigned), accepts it in
7 of 8 (the PostgreSQL fence refused keys=None before too).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis
from conftest import fresh_pg_url

import stockade
from stockade.core.errors import InvalidArgument, StockadeError
from stockade.core.limits import TOKEN_VALUE_MAX
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring, save_keyring
from stockade.resources import postgres as pg
from stockade.resources.files import FencedDirectory
from stockade.resources.redis import RedisFence
from stockade.resources.sqlite_db import SQLiteFence
from stockade.testing.conformance.fence_keys import legacy_keys
from stockade.testing.servers.redis import RedisServer, require_redis


def _forge(cluster_id: str) -> FencingToken:
    return FencingToken(cluster_id, "reports", TOKEN_VALUE_MAX)


def _store_setup(tmp_path: Path, arrange: Callable[[Path, Path], Path]) -> bool:
    """An embedded coordinator and its store in ``data``; ``arrange(data, tmp_path)`` changes the files and
    names the store file then opened by url without keys (as README's examples do)."""
    data = tmp_path / "data"
    with stockade.connect(f"sqlite:///{data}/coord.db?process=embedded") as coord:
        cluster = coord.cluster_id
        with stockade.open_store(f"sqlite:///{data}/store.db", cluster_id=cluster) as store, \
                coord.lock("reports", ttl_ms=5_000) as lease:
            store.put("reports", "daily.csv", b"honest", token=lease.token)
    path = arrange(data, tmp_path)
    try:
        store = stockade.open_store(f"sqlite:///{path}", cluster_id=cluster)
    except InvalidArgument:
        return False  # refused to open
    with store:
        try:
            store.put("reports", "daily.csv", b"forged", token=_forge(cluster))
        except StockadeError:
            return False
        return True


def _backup_beside(data: Path, tmp_path: Path) -> Path:
    shutil.copy(data / "coord.keys", data / "coord.keys.bak")  # the finding's name: not a *.keys file
    shutil.copy(data / "coord.keys", data / "coord.bak.keys")  # the same copy under a name discovery reads
    return data / "store.db"


def _sixteen_other_clusters(data: Path, tmp_path: Path) -> Path:
    for index in range(16):  # sorted before coord.keys
        save_keyring(data / f"a{index:02d}.keys", ephemeral_keyring(f"{index + 1:016x}"))
    return data / "store.db"


def _store_elsewhere(data: Path, tmp_path: Path) -> Path:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if (data / f"store.db{suffix}").exists():
            shutil.copy(data / f"store.db{suffix}", elsewhere / f"store.db{suffix}")
    return elsewhere / "store.db"


def _keyring_renamed(data: Path, tmp_path: Path) -> Path:
    (data / "coord.keys").rename(data / "coord.keys.old")
    return data / "store.db"


def _files_none(tmp_path: Path, cluster: str) -> bool:
    try:
        directory = FencedDirectory(tmp_path / "files", keys=None, cluster_id=cluster)
    except InvalidArgument:
        return False
    with directory:
        directory.write("daily.csv", b"forged", _forge(cluster))
        return True


def _sqlite_fence_none(tmp_path: Path, cluster: str) -> bool:
    sqlite3.connect(tmp_path / "app.db").close()
    try:
        fence = SQLiteFence(tmp_path / "app.db", keys=None, cluster_id=cluster)
    except InvalidArgument:
        return False
    with fence, fence.fenced(_forge(cluster)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (v TEXT)")
        conn.execute("INSERT INTO t VALUES ('forged')")
        return True


def _redis_fence_none(tmp_path: Path, cluster: str) -> bool:
    require_redis()
    server = RedisServer(tmp_path / "redis")
    try:
        try:
            fence = RedisFence(redis.Redis.from_url(server.url), keys=None, cluster_id=cluster)
        except InvalidArgument:
            return False
        fence.set(_forge(cluster), "{reports}:daily", b"forged")
        return True
    finally:
        server.stop()


def _postgres_fence_none(tmp_path: Path, cluster: str) -> bool:
    with fresh_pg_url() as url, psycopg.connect(url, autocommit=True) as conn:
        try:
            pg.install(conn, keys=None, cluster_id=cluster)
        except InvalidArgument:
            return False
        with pg.fenced(conn, _forge(cluster), "reports", keys=None):
            return True


SETUPS: dict[str, Callable[[Path], bool]] = {
    "backup coord.keys.bak beside the store": lambda tmp: _store_setup(tmp, _backup_beside),
    "16 other clusters' keyrings in the directory": lambda tmp: _store_setup(tmp, _sixteen_other_clusters),
    "the store opened from another directory": lambda tmp: _store_setup(tmp, _store_elsewhere),
    "the keyring renamed away": lambda tmp: _store_setup(tmp, _keyring_renamed),
    "keys=None on FencedDirectory": lambda tmp: _files_none(tmp, "0123456789abcdef"),
    "keys=None on the SQLite fence": lambda tmp: _sqlite_fence_none(tmp, "0123456789abcdef"),
    "keys=None on the Redis fence": lambda tmp: _redis_fence_none(tmp, "0123456789abcdef"),
    "keys=None on the PostgreSQL fence": lambda tmp: _postgres_fence_none(tmp, "0123456789abcdef"),
}


def _run(tmp_path: Path) -> list[str]:
    accepted = []
    for index, (name, setup) in enumerate(SETUPS.items()):
        directory = tmp_path / f"setup{index}"
        directory.mkdir()
        if setup(directory):
            accepted.append(name)
    return accepted


def test_a_forged_max_value_token_is_accepted_in_none_of_the_eight_setups(tmp_path: Path) -> None:
    accepted = _run(tmp_path)
    assert accepted == [], f"accepted in {len(accepted)} of {len(SETUPS)}: {accepted}"


def test_control_the_behaviour_before_l2_accepts_it_in_seven(tmp_path: Path) -> None:
    with legacy_keys():
        accepted = _run(tmp_path)
    assert accepted == [name for name in SETUPS if "PostgreSQL" not in name], accepted
    assert len(accepted) == 7


@pytest.mark.parametrize("sees_the_coordinator", [True, False], ids=["beside", "control-keys-in-memory"])
def test_an_embedded_store_refuses_a_token_above_the_last_issued(tmp_path: Path, sees_the_coordinator: bool) -> None:
    """Even with the keyring (leaked: it signs too), a store that can see its coordinator (discovered
    beside ``coord.db``) refuses a value above the coordinator's last issued token for the scope. The
    control is the store as it was before: the same keys, but no view of the coordinator (the keyring
    given in memory), which takes the forgery and raises its mark to the maximum."""
    data = tmp_path / "data"
    with stockade.connect(f"sqlite:///{data}/coord.db?process=embedded") as coord:
        leaked = coord.verify_keys()
        keys = None if sees_the_coordinator else FixedKeys(leaked.keyring)  # type: ignore[attr-defined]
        with stockade.open_store(f"sqlite:///{data}/store.db", cluster_id=coord.cluster_id, keys=keys) as store:
            with coord.lock("reports", ttl_ms=5_000) as lease:
                store.put("reports", "daily.csv", b"honest", token=lease.token)
            forged = leaked.sign(FencingToken(coord.cluster_id, "reports", TOKEN_VALUE_MAX))  # type: ignore[attr-defined]
            if not sees_the_coordinator:
                store.put("reports", "daily.csv", b"forged", token=forged)
                assert store.high_water("reports") == TOKEN_VALUE_MAX
                return
            with pytest.raises(stockade.TokenMismatch) as info:
                store.put("reports", "daily.csv", b"forged", token=forged)
            assert info.value.reason == "forged (above-issued)"
            assert store.high_water("reports") == lease.token.value
            with coord.lock("reports", ttl_ms=5_000) as next_lease:  # the next holder is unaffected
                store.put("reports", "daily.csv", b"next", token=next_lease.token)
