"""Resource urls, the one registry: the stores `stockade.open_store` opens (`SCHEMES`) and the resources
`stockade floor` raises (`FLOOR_TARGETS`), one line per scheme.

    sqlite:///path/to/store.db   -> SQLiteStore on that file (created with a cluster id)
    memory://name                -> MemoryStore shared by name in this process

Each line names what opens it as a ``"module:function"`` string, imported on use (as SQLAlchemy loads a
dialect), so the base install imports no driver. A new adapter is a folder, ``resources/<name>/``, and its
line here (and its parameter to the conformance suite, which refuses a scheme it does not test). A
`stockade serve` also serves a store: its ``http``/``https`` lines are in `stockade.coordinators.registry`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.limits import AUDIT_RECORDS_MAX, IDEMPOTENCY_KEYS_MAX, VALUE_BYTES_MAX
from stockade.resources._inputs import BUSY_TIMEOUT_MS_DEFAULT
from stockade.resources.port import TransactionalStorePort

__all__ = [
    "StoreOptions", "StoreFactory", "SCHEMES", "FLOOR_TARGETS", "CHECK_TARGETS", "DEFAULT_PORTS", "scheme_of",
    "open_resource", "load", "FENCE_TARGETS",
]


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """The bounds every adapter takes (each validated by the adapter; see `SQLiteStore`)."""

    value_bytes_max: int = VALUE_BYTES_MAX
    busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT
    audit_records_max: int = AUDIT_RECORDS_MAX
    idempotency_keys_max: int = IDEMPOTENCY_KEYS_MAX
    #: What verifies token MACs (see `SQLiteStore`); ``"unsigned"`` checks none (unsafe). None: a
    #: sqlite store uses the keyring of its cluster in its own directory if there is exactly one
    #: (its coordinator's), and refuses to open if there is none or several (L2: never unsigned).
    keys: object = None
    #: The coordinator's last issued token of a scope, where the store can see it; a value above
    #: it is refused as forged. None: a sqlite store reads it from the coordinator file beside its
    #: keyring (``x.keys`` -> ``x.db``) when there is one.
    issued: Callable[[str], int] | None = None


StoreFactory = Callable[[str, "str | None", StoreOptions], TransactionalStorePort]
"""``(target, cluster_id, options) -> store``; ``target`` is the url after ``scheme://``."""


#: scheme -> ``"module:function"`` of a `StoreFactory`.
SCHEMES: Mapping[str, str] = MappingProxyType({
    "sqlite": "stockade.resources.store.open:open_store",
    "memory": "stockade.resources.memory:open_store",
})

#: scheme -> ``"module:function"`` of ``open_floor_target(url, *, cluster_id)`` (`stockade.resources.floor`).
FLOOR_TARGETS: Mapping[str, str] = MappingProxyType({
    "sqlite": "stockade.resources.store._floor_sqlite:open_floor_target",
    "postgresql": "stockade.resources.postgres:open_floor_target",
    "postgres": "stockade.resources.postgres:open_floor_target",
    "redis": "stockade.resources.redis:open_floor_target",
    "rediss": "stockade.resources.redis:open_floor_target",
    "file": "stockade.resources.files:open_floor_target",
})

#: What `stockade check` runs against a resource url of each scheme: ``"module:function"``, the function
#: taking the url's rest and answering the target's class once it has seen the resource exists (docs/check.md).
CHECK_TARGETS: Mapping[str, str] = MappingProxyType({
    "sqlite": "stockade.check.targets:sqlite_target",
    "file": "stockade.check.targets:files_target",
    "http": "stockade.check.targets:store_target",
    "https": "stockade.check.targets:store_target",
    "postgresql": "stockade.check._targets_net:postgres_target",
    "postgres": "stockade.check._targets_net:postgres_target",
    "redis": "stockade.check._targets_net:redis_target",
})
#: Each fence adapter's conformance descriptor: target name -> ``"module:NAME"`` of a
#: `stockade.testing.conformance.fence_target.FenceTarget` (its harness opener and its capabilities, or why
#: it lacks each), imported only by the conformance run (`fence_targets`). The project's own adapters'
#: descriptors ship with the conformance kit (``stockade.testing.fences.targets``; the servers they start
#: are `stockade.testing.servers`).
FENCE_TARGETS: Mapping[str, str] = MappingProxyType({
    "store-memory": "stockade.testing.fences.targets:STORE_MEMORY",
    "store-sqlite": "stockade.testing.fences.targets:STORE_SQLITE",
    "sqlite-db": "stockade.testing.fences.targets:SQLITE_DB",
    "sqlite-db-sqlalchemy": "stockade.testing.fences.targets:SQLITE_DB_SQLALCHEMY",
    "files": "stockade.testing.fences.targets:FILES",
    "postgres": "stockade.testing.fences.targets:POSTGRES",
    "postgres-async": "stockade.testing.fences.targets:POSTGRES_ASYNC",
    "postgres-sqlalchemy": "stockade.testing.fences.targets:POSTGRES_SQLALCHEMY",
    "postgres-sql_ascii": "stockade.testing.fences.targets:POSTGRES_SQL_ASCII",
    "redis": "stockade.testing.fences.targets:REDIS",
    "redis-async": "stockade.testing.fences.targets:REDIS_ASYNC",
    "toy-json": "stockade.testing.toy_fence.conformance:FENCE_TARGET",
})
#: The default port of each scheme whose requests `stockade check`'s proxy can hold (no TLS scheme: the
#: rewritten host would not match the server's certificate).
DEFAULT_PORTS: Mapping[str, int] = MappingProxyType({"postgresql": 5432, "postgres": 5432, "redis": 6379, "http": 80})

def load(target: str) -> Any:
    """The object a ``"module:function"`` string names, its module imported now."""
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)


def scheme_of(url: object) -> str | None:
    """The scheme of ``url`` if it is a string with ``://``, else None."""
    if not isinstance(url, str):
        return None
    scheme, sep, _ = url.partition("://")
    return scheme if sep else None


def open_resource(
    url: str, *, cluster_id: str | None = None, options: StoreOptions | None = None
) -> TransactionalStorePort:
    """Open the fenced store a url names.

    Args:
        url: ``scheme://target`` with a scheme of `SCHEMES`.
        cluster_id: the cluster whose tokens the store trusts; required to create one.
        options: bounds (defaults: `StoreOptions()`).

    Raises:
        InvalidArgument: not a url, an unknown scheme, or a bad target or option.
        BackendUnavailable: the resource cannot be opened.
    """
    scheme = scheme_of(url)
    if scheme is None:
        raise InvalidArgument("url", "must be a url such as sqlite:///path/to/store.db")
    factory = SCHEMES.get(scheme)
    if factory is None:
        raise InvalidArgument("url", f"unknown store scheme {scheme!r}; supported: {', '.join(sorted(SCHEMES))}")
    opened: TransactionalStorePort = load(factory)(url.partition("://")[2], cluster_id,
                                                    StoreOptions() if options is None else options)
    return opened
