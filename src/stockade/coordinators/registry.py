"""The coordinator backends by url scheme: what `stockade.connect()` and the CLI read.

A backend that keeps its records in a store of its own is one module (a
`stockade.core.engine.RecordStore` and a `LeaseEngine` over it) plus one entry
here; the client's ports, the lease objects, the keepalive and the conformance
suite come for free. ``http``/``https`` (a `stockade serve`) are spoken by the
client itself and are listed only for their capabilities.

Every backend declares what it can do (`Capability`); `connect()` refuses an
option a backend cannot honour instead of ignoring it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.coordinators import memory
from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.engine import LeaseEngine
from stockade.core.errors import InvalidArgument
from stockade.core.leases import LeasePolicy
from stockade.keys import FixedKeys, KeyFile, create_keyring, ephemeral_keyring, keyring_path

__all__ = [
    "open_signed_sqlite", "Capability", "CoordinatorBackend", "COORDINATORS", "SCHEMES_PLANNED", "coordinator_backend",
]


class Capability(enum.Enum):
    """What a coordinator backend guarantees or accepts."""

    FIFO_WAIT = "fifo-wait"  # waiters are served first in, first out, each with a deadline (C4)
    CLIENT_LOCK_DELAY = "client-lock-delay"  # connect(lock_delay_ms=...) is honoured (C5)
    DURABLE_TOKENS = "durable-tokens"  # tokens keep increasing across restarts of every process (C1)
    NATIVE_WAIT = "native-wait"  # a waiter is woken by the backend, not by polling
    # Each grant's token is the scope's previous + 1. Without it tokens only strictly increase
    # (etcd: the holder key's create revision, shared by every key of the cluster).
    DENSE_TOKENS = "dense-tokens"


@dataclass(frozen=True, slots=True)
class CoordinatorBackend:
    """One url scheme.

    Attributes:
        scheme: the url scheme.
        summary: one line for docs and errors.
        capabilities: what it guarantees or accepts.
        open_engine: ``(location, policy) -> LeaseEngine`` for a backend the
            client runs in process (``location`` is the url after ``scheme://``);
            None for a remote protocol the client speaks itself.
    """

    scheme: str
    summary: str
    capabilities: frozenset[Capability]
    open_engine: Callable[[str, LeasePolicy], LeaseEngine] | None = None

    def __post_init__(self) -> None:
        # C4 is part of the contract, not an option: a backend without it is not a coordinator.
        if Capability.FIFO_WAIT not in self.capabilities:
            raise ValueError(f"backend {self.scheme!r} must serve waiters in FIFO order")


def open_signed_sqlite(path: Path, policy: LeasePolicy, **options: Any) -> SQLiteCoordinator:
    """A `SQLiteCoordinator` that signs its tokens with the keyring next to its file (created with it).

    ``dir/coord.db`` signs with ``dir/coord.keys`` (`stockade.keys`; docs/tokens.md).

    Raises:
        BackendUnavailable: the keyring cannot be created or read, or is another cluster's.
    """
    coordinator = SQLiteCoordinator(path, policy=policy, **options)
    try:
        keyring = create_keyring(keyring_path(path), coordinator.cluster_id)
        coordinator.signer = KeyFile(keyring_path(path), keyring.cluster_id)
    except BaseException:
        coordinator.close()
        raise
    return coordinator


def _open_sqlite(location: str, policy: LeasePolicy) -> LeaseEngine:
    if not location or "\x00" in location:
        raise InvalidArgument("url", "sqlite url needs a file path: sqlite:///path/to/file.db")
    return open_signed_sqlite(Path(location), policy)


def _open_memory(location: str, policy: LeasePolicy) -> LeaseEngine:
    if not location or not location.isascii() or not location.isprintable() or len(location) > 200:
        raise InvalidArgument("url", "memory url needs a name: memory://NAME (1..200 printable ASCII)")
    coordinator = memory.named(location, policy=policy)
    if coordinator.signer is None:  # in-process keys: they live and die with the coordinator
        coordinator.signer = FixedKeys(ephemeral_keyring(coordinator.cluster_id))
    return coordinator


def _open_postgres(scheme: str) -> Callable[[str, LeasePolicy], LeaseEngine]:
    def open_engine(location: str, policy: LeasePolicy) -> LeaseEngine:
        if not location or "\x00" in location:
            raise InvalidArgument("url", f"{scheme} url needs a server: {scheme}://user@host:5432/dbname")
        from stockade.coordinators.postgres import open_postgres  # psycopg only when asked for

        return open_postgres(f"{scheme}://{location}", policy)

    return open_engine


_DURABLE_REMOTE = frozenset({Capability.FIFO_WAIT, Capability.DURABLE_TOKENS, Capability.NATIVE_WAIT})
_DENSE = frozenset({Capability.DENSE_TOKENS})

COORDINATORS: dict[str, CoordinatorBackend] = {
    backend.scheme: backend
    for backend in (
        CoordinatorBackend(
            "sqlite", "embedded: one SQLite file shared by the processes of one host",
            frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY, Capability.DURABLE_TOKENS}) | _DENSE,
            _open_sqlite,
        ),
        CoordinatorBackend(
            "memory", "in this process only; tokens do not survive it (tests, examples)",
            frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY}) | _DENSE,
            _open_memory,
        ),
        *(
            CoordinatorBackend(
                scheme, "PostgreSQL tables (libpq url, multi-host with target_session_attrs=read-write)",
                frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY, Capability.DURABLE_TOKENS,
                           Capability.NATIVE_WAIT}) | _DENSE,
                _open_postgres(scheme),
            )
            for scheme in ("postgresql", "postgres")
        ),
        CoordinatorBackend("http", "a stockade serve", _DURABLE_REMOTE | _DENSE),
        CoordinatorBackend("https", "a stockade serve over TLS", _DURABLE_REMOTE | _DENSE),
        # The client speaks etcd itself (client/_async/_etcd.py): no engine in process.
        CoordinatorBackend("etcd", "an etcd 3.4+ cluster: leases and watches, tokens from create revisions",
                           _DURABLE_REMOTE | {Capability.CLIENT_LOCK_DELAY}),
        # Likewise ZooKeeper (client/_async/_zk.py, over kazoo): tokens are czxids, not dense.
        *(
            CoordinatorBackend(scheme, "a ZooKeeper 3.5+ ensemble: ephemeral sequential nodes, tokens from czxids",
                               _DURABLE_REMOTE | {Capability.CLIENT_LOCK_DELAY})
            for scheme in ("zookeeper", "zk")
        ),
    )
}

#: Schemes named in the docs whose backends are not built yet.
SCHEMES_PLANNED: tuple[str, ...] = ()


def coordinator_backend(url: object, field: str = "url") -> tuple[CoordinatorBackend, str]:
    """The backend of ``url`` and the rest of the url after ``scheme://``.

    Raises:
        InvalidArgument: not a url, an unknown scheme, or a scheme not built yet.
    """
    if not isinstance(url, str):
        raise InvalidArgument(field, f"must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidArgument(field, "must be a url such as sqlite:///path/to/coord.db")
    backend = COORDINATORS.get(scheme)
    if backend is not None:
        return backend, rest
    if scheme in SCHEMES_PLANNED:
        raise InvalidArgument(field, f"scheme {scheme!r} is planned but not available in this version")
    hint = ""
    if scheme != scheme.strip():
        hint = " (the url has spaces before it)"
    elif scheme.lower() in COORDINATORS:
        hint = f" (schemes are lower case: {scheme.lower()}://)"
    raise InvalidArgument(field, f"unknown scheme {scheme!r}{hint}; supported: {', '.join(sorted(COORDINATORS))}")
