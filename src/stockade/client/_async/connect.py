"""Opening coordinators and stores by url."""

from __future__ import annotations

import os

from stockade.client._async.coordinator import AsyncCoordinator
from stockade.client._async.store import AsyncFencedStore
from stockade.client._hooks import Hooks, validate_hooks
from stockade.coordinators.registry import (
    COORDINATORS,
    REMOTE_OPTIONS,
    Capability,
    PortOptions,
    coordinator_backend,
    load,
)
from stockade.core.errors import InvalidArgument
from stockade.core.leases import LeasePolicy
from stockade.resources.registry import SCHEMES as STORE_SCHEMES
from stockade.resources.registry import StoreOptions, open_resource, scheme_of

__all__ = ["connect_async", "open_store_async"]


def connect_async(
    url: str,
    *,
    lock_delay_ms: int = 0,
    timeout_ms: int | None = None,
    connect_timeout_ms: int | None = None,
    auth_token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    hooks: Hooks | None = None,
) -> AsyncCoordinator:
    """Open a coordinator: ``coord = await connect_async(url)`` or ``async with connect_async(url) as coord``.

    The url's scheme picks the backend (`stockade.coordinators.registry`).
    Inside a running event loop nothing blocks: a remote coordinator's cluster
    id is fetched on the first ``await`` of the handle (or ``async with``, or
    the first acquire); outside a loop, and in the sync client, it is fetched here.

    Args:
        url: ``sqlite:///path/to/coord.db`` (created, with a new cluster id, if
            missing; reached through the host's one coordinator process for that file,
            started on demand, or with ``?process=embedded`` written in this process
            itself), ``http://host:port`` / ``https://host:port`` for a
            `stockade serve` (contacted once here, for its cluster id), or
            ``memory://NAME`` (this process only; for tests and examples).
        lock_delay_ms: after an *expiry*, keep the scope ungrantable this long
            (C5). Only where the backend declares `Capability.CLIENT_LOCK_DELAY`
            (a server has its own setting; so has a file's host process: with
            ``sqlite://``, only with ``?process=embedded``).
        timeout_ms: remote only; the deadline of each request, 1..600_000
            (default 10_000). An acquire waits up to ``wait_ms`` on top.
        connect_timeout_ms: remote only; the deadline of a connect (default 3_000).
        auth_token: remote only; the bearer token (default ``$STOCKADE_AUTH_TOKEN``).
        tls_ca: ``https`` only; a PEM CA bundle to verify the server by.
        hooks: the user's telemetry callbacks on every lease (`stockade.client.Hooks`).

    Raises:
        InvalidArgument: unknown url or option.
        BackendUnavailable: the coordinator cannot be opened or reached (when
            opened inside an event loop: raised by the first ``await``).
    """
    backend, location = coordinator_backend(url)
    location, params = backend.url_query(location)
    if lock_delay_ms and Capability.CLIENT_LOCK_DELAY not in backend.capabilities:
        raise InvalidArgument("lock_delay_ms", f"{backend.scheme}:// does not take it from the client "
                                               "(a server has its own setting)")
    options = PortOptions(url, location, backend.capabilities, lock_delay_ms=lock_delay_ms, timeout_ms=timeout_ms,
                          connect_timeout_ms=connect_timeout_ms, auth_token=auth_token, tls_ca=tls_ca)
    hooks = validate_hooks(hooks)
    query_port = backend.query_port(params)  # sqlite:///coord.db (process=host): the host's coordinator process
    if query_port is not None:
        return AsyncCoordinator(backend.open_query_port("_async", query_port, options), hooks=hooks)
    if backend.port is not None:
        return AsyncCoordinator(backend.open_port("_async", options), hooks=hooks)
    options.refuse(*REMOTE_OPTIONS)
    # On use: only an engine in this process needs its port (and the engine's own modules, SQLite's among them).
    from stockade.client._async._embedded import AsyncEmbeddedCoordinatorPort

    engine = backend.open_engine(location, LeasePolicy(lock_delay_ms=lock_delay_ms))
    return AsyncCoordinator(AsyncEmbeddedCoordinatorPort(engine, capabilities=backend.capabilities), hooks=hooks)


def open_store_async(
    url: str,
    *,
    cluster_id: str | None = None,
    timeout_ms: int | None = None,
    connect_timeout_ms: int | None = None,
    auth_token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    keys: object = None,
    hooks: Hooks | None = None,
) -> AsyncFencedStore:
    """Open a fenced store: ``store = await open_store_async(url, ...)`` or ``async with``.

    As for `connect_async`, nothing blocks inside a running event loop: a
    remote store's cluster id is fetched (and checked) on the first ``await``
    or use of the handle.

    Args:
        url: ``sqlite:///path/to/store.db``, ``memory://name`` (a store shared by
            name in this process), another scheme of `stockade.resources.registry`,
            or the ``http(s)://`` url of a `stockade serve` (whose store trusts
            that server's tokens).
        cluster_id: the coordinator cluster whose tokens the store accepts
            (``coord.cluster_id``). Required when an embedded store is created;
            checked against the store's own when given.
        timeout_ms, connect_timeout_ms, auth_token, tls_ca: as for `connect_async`.
        keys: embedded only; what the store verifies token MACs with
            (``coord.verify_keys()``, a keyring path; docs/tokens.md), or
            ``"unsigned"``: no MAC check (legacy, unsafe). None: a ``sqlite://``
            store uses the one keyring of its cluster in its own directory and
            refuses to open if there is none or several; a ``memory://`` store
            the keys of the ``memory://`` coordinator of its name, if one is open,
            else it refuses (L2: verification never turns itself off). Where the
            store can see its coordinator (the coordinator file beside the keyring,
            the ``memory://`` coordinator), it also refuses a token above the
            coordinator's last issued one for the scope.
        hooks: the user's telemetry; ``hooks.on_reject`` sees every fence rejection.

    Raises:
        InvalidArgument: unknown url or option, or a ``cluster_id`` that differs from the store's.
        BackendUnavailable: the store cannot be opened or reached.
    """
    hooks = validate_hooks(hooks)
    scheme = scheme_of(url)
    options = PortOptions(url, url.partition("://")[2] if scheme else "", frozenset(), timeout_ms=timeout_ms,
                          connect_timeout_ms=connect_timeout_ms, auth_token=auth_token, tls_ca=tls_ca)
    remote = COORDINATORS.get(scheme) if scheme is not None else None
    if remote is not None and remote.store is not None:  # a coordinator that serves a store (a stockade serve)
        return AsyncFencedStore(remote.open_store("_async", options, cluster_id=cluster_id, keys=keys), hooks=hooks)
    options.refuse(*REMOTE_OPTIONS)
    if scheme is not None and scheme not in STORE_SCHEMES:
        served = sorted({*STORE_SCHEMES, *(s for s, backend in COORDINATORS.items() if backend.store is not None)})
        raise InvalidArgument("url", f"unknown store scheme {scheme!r}; supported: {', '.join(served)}")
    from stockade.client._async._embedded import AsyncEmbeddedStorePort

    store = open_resource(url, cluster_id=cluster_id, options=_store_options(url, keys))
    return AsyncFencedStore(AsyncEmbeddedStorePort(store), hooks=hooks)


def _store_options(url: str, keys: object) -> StoreOptions:
    """``keys`` and, for a store beside an in-process coordinator of the same url (``memory://NAME``, its
    registry entry's ``beside``), that coordinator's keys (when none are given) and its last issued tokens."""
    scheme = scheme_of(url)
    backend = COORDINATORS.get(scheme) if scheme is not None else None
    if backend is None or backend.beside is None:
        return StoreOptions(keys=keys)
    coordinator = load(backend.beside)(url.partition("://")[2])
    if coordinator is None:
        return StoreOptions(keys=keys)
    return StoreOptions(keys=coordinator.signer if keys is None else keys, issued=coordinator.last_issued)
