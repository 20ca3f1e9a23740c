"""Store urls: one line per scheme, ``{scheme: factory}``.

    sqlite:///path/to/store.db   -> SQLiteStore on that file (created with a cluster id)
    memory://name                -> MemoryStore shared by name in this process

A new adapter adds its line to `SCHEMES` (and its parameter to the
conformance suite, which refuses a scheme it does not test).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from stockade.core.errors import InvalidArgument
from stockade.core.limits import AUDIT_RECORDS_MAX, IDEMPOTENCY_KEYS_MAX, VALUE_BYTES_MAX
from stockade.keys import find_keyring
from stockade.resources.memory import MemoryStore
from stockade.resources.port import TransactionalStorePort
from stockade.resources.sqlite_store import BUSY_TIMEOUT_MS_DEFAULT, SQLiteStore

__all__ = ["StoreOptions", "StoreFactory", "SCHEMES", "scheme_of", "open_resource"]


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """The bounds every adapter takes (each validated by the adapter; see `SQLiteStore`)."""

    value_bytes_max: int = VALUE_BYTES_MAX
    busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT
    audit_records_max: int = AUDIT_RECORDS_MAX
    idempotency_keys_max: int = IDEMPOTENCY_KEYS_MAX
    #: What verifies token MACs (see `SQLiteStore`). None: a sqlite store uses the keyring of its
    #: cluster in its own directory if there is exactly one (its coordinator's), else checks none.
    keys: object = None


StoreFactory = Callable[[str, "str | None", StoreOptions], TransactionalStorePort]
"""``(target, cluster_id, options) -> store``; ``target`` is the url after ``scheme://``."""


def _open_sqlite(target: str, cluster_id: str | None, options: StoreOptions) -> SQLiteStore:
    if not target or "\x00" in target:
        raise InvalidArgument("url", "sqlite url needs a file path: sqlite:///path/to/file.db")
    store = SQLiteStore(
        Path(target), cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=options.keys,
    )
    if options.keys is None:
        found = find_keyring(Path(target).parent, store.cluster_id)
        if found is not None:
            try:
                store.use_keys(found, store.cluster_id)
            except BaseException:
                store.close()
                raise
    return store


def _open_memory(target: str, cluster_id: str | None, options: StoreOptions) -> MemoryStore:
    return MemoryStore(
        target, cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=options.keys,
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
