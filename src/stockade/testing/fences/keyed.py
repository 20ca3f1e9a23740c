"""Openers for the L2 suite (`stockade.testing.conformance.fence_keys`): each adapter's resource of one
test, opened again and again with ``keys=`` exactly as a user passes them.

Each target's descriptor (`stockade.testing.fences.targets`) names one of these: a context manager
``(directory, name) -> opener``: it owns the resource (a directory, a file, a Redis server, a
PostgreSQL database) for the test, and every harness the opener returns is a handle on it that does
not own it (closing one leaves the resource to the next).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg

from stockade.core.signing import Keyring
from stockade.keys import save_keyring
from stockade.resources import postgres as pg
from stockade.resources.memory import MemoryStore
from stockade.resources.registry import StoreOptions, open_resource
from stockade.testing.conformance.fence import CLUSTER
from stockade.testing.fences.files import FilesHarness
from stockade.testing.fences.postgres import HARNESSES, _database, _free
from stockade.testing.fences.redis import AsyncRedisHarness, SyncRedisHarness, _Loop
from stockade.testing.fences.sqlite_db import SQLiteDbHarness, user_database
from stockade.testing.fences.store import StoreHarness
from stockade.testing.servers.postgres import shared_server
from stockade.testing.servers.redis import RedisServer, require_redis

Opener = Callable[..., Any]


def _place(directory: Path, beside: Sequence[tuple[str, Keyring]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, keyring in beside:
        save_keyring(directory / name, keyring)


@contextmanager
def files(directory: Path, name: str) -> Iterator[Opener]:
    def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
        _place(directory, beside)
        return FilesHarness(directory / "files", CLUSTER, keys, None)  # type: ignore[arg-type]

    yield open_keyed


def sqlite_db(sqlalchemy: bool) -> Callable[[Path, str], AbstractContextManager[Opener]]:
    @contextmanager
    def owner(directory: Path, name: str) -> Iterator[Opener]:
        directory.mkdir(parents=True, exist_ok=True)
        user_database(directory / "user.db")

        def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
            _place(directory, beside)
            return SQLiteDbHarness(directory / "user.db", CLUSTER, keys, None, sqlalchemy)  # type: ignore[arg-type]

        yield open_keyed

    return owner


@contextmanager
def store_sqlite(directory: Path, name: str) -> Iterator[Opener]:
    def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
        _place(directory, beside)  # the store's own directory: where discovery looks
        url = f"sqlite:///{directory / 'store.db'}"
        return StoreHarness(open_resource(url, cluster_id=CLUSTER, options=StoreOptions(keys=keys)))

    yield open_keyed


@contextmanager
def store_memory(directory: Path, name: str) -> Iterator[Opener]:
    def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
        _place(directory, beside)
        return StoreHarness(MemoryStore(f"l2-{name}", cluster_id=CLUSTER, keys=keys,
                                        value_bytes_max=StoreHarness.value_bytes_max))

    yield open_keyed


def redis_fence(kind: str) -> Callable[[Path, str], AbstractContextManager[Opener]]:
    @contextmanager
    def owner(directory: Path, name: str) -> Iterator[Opener]:
        require_redis()
        server = RedisServer(directory / "redis")
        loop = _Loop() if kind == "redis-async" else None
        try:
            def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
                _place(directory, beside)
                if loop is None:
                    return SyncRedisHarness(server, CLUSTER, keys, None, owner=False)  # type: ignore[arg-type]
                return AsyncRedisHarness(server, CLUSTER, keys, None, loop=loop)  # type: ignore[arg-type]

            yield open_keyed
        finally:
            if loop is not None:
                loop.close()
            server.stop()

    return owner


def postgres(kind: str) -> Callable[[Path, str], AbstractContextManager[Opener]]:
    @contextmanager
    def owner(directory: Path, name: str) -> Iterator[Opener]:
        server = shared_server()
        harness, encoding = HARNESSES[kind]
        dbname = _database(server, encoding)
        try:
            def open_keyed(keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> Any:
                _place(directory, beside)
                with psycopg.connect(server.dsn_of(dbname), autocommit=True) as admin:
                    pg.install(admin, keys=keys, cluster_id=CLUSTER)  # what a user runs first: it refuses None
                return harness(server, dbname, CLUSTER, keys, None, owner=False, encoding=encoding)  # type: ignore[arg-type]

            yield open_keyed
        finally:
            _free.setdefault((server.port, encoding), []).append(dbname)

    return owner
