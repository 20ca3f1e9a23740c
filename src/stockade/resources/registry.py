"""Store urls: one line per scheme, ``{scheme: factory}``.

    sqlite:///path/to/store.db   -> SQLiteStore on that file (created with a cluster id)
    memory://name                -> MemoryStore shared by name in this process

A new adapter adds its line to `SCHEMES` (and its parameter to the
conformance suite, which refuses a scheme it does not test).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import quote

from stockade.core.errors import InvalidArgument
from stockade.core.limits import AUDIT_RECORDS_MAX, IDEMPOTENCY_KEYS_MAX, VALUE_BYTES_MAX
from stockade.keys import KeyFile, find_keyring
from stockade.resources._issued import CoordinatorIssued, coordinator_beside
from stockade.resources._verify import TOKENLESS, UNSIGNED
from stockade.resources.memory import MemoryStore
from stockade.resources.port import TransactionalStorePort
from stockade.resources.store.sqlite_store import BUSY_TIMEOUT_MS_DEFAULT, SQLiteStore

__all__ = ["StoreOptions", "StoreFactory", "SCHEMES", "scheme_of", "open_resource"]


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


def _cluster_of_file(path: Path) -> str | None:
    """The cluster id an existing store file names (None: no such file, or not readable as one: the
    store's constructor then says what is wrong)."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT v FROM meta WHERE k = 'cluster_id'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return row[0] if row is not None and isinstance(row[0], str) else None


def _keyring_file(keys: object) -> Path | None:
    """The keyring file ``keys`` name (a path or a `KeyFile`), if any: where its coordinator may be beside."""
    if isinstance(keys, KeyFile):
        return keys.path
    if isinstance(keys, (str, os.PathLike)) and keys not in (UNSIGNED, TOKENLESS):
        return Path(keys)
    return None


def _open_sqlite(target: str, cluster_id: str | None, options: StoreOptions) -> SQLiteStore:
    if not target or "\x00" in target:
        raise InvalidArgument("url", "sqlite url needs a file path: sqlite:///path/to/file.db")
    path, keys, issued = Path(target), options.keys, options.issued
    cluster = cluster_id if cluster_id is not None else _cluster_of_file(path)
    if keys is None and cluster is not None:  # discovery: the one keyring of the cluster beside it, else refuse (L2)
        keys = find_keyring(path.parent, cluster)
    keyring = _keyring_file(keys)
    if issued is None and keyring is not None:
        beside = coordinator_beside(keyring)
        issued = None if beside is None else CoordinatorIssued(beside)
    return SQLiteStore(
        path, cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=keys, issued=issued,
    )


def _open_memory(target: str, cluster_id: str | None, options: StoreOptions) -> MemoryStore:
    return MemoryStore(
        target, cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=options.keys, issued=options.issued,
    )


SCHEMES: Mapping[str, StoreFactory] = MappingProxyType({
    "sqlite": _open_sqlite,
    "memory": _open_memory,
})


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
    return factory(url.partition("://")[2], cluster_id, StoreOptions() if options is None else options)
