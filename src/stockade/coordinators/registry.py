"""The coordinator backends by url scheme: what `stockade.connect()`, the server and the CLI read.

A backend is a folder, ``coordinators/<name>/``, plus one entry here. The entry
names what opens it as a ``"module:function"`` string, imported on use (as
SQLAlchemy loads a dialect), so the base install imports no driver and this
module imports no backend:

- ``engine``: ``(location, policy) -> LeaseEngine`` for a backend the client
  runs in process over the one lease engine (`stockade.core.engine`); the
  client's engine port (`stockade.client._async._embedded`) serves it.
- ``port``: ``(options: PortOptions) -> port`` for a backend with a client port
  of its own (``coordinators/<name>/_async/port.py``, its sync twin generated
  in ``_sync/``). The string names the async module; `CoordinatorBackend.open_port`
  reads the twin the caller names.

Every backend declares what it can do (`Capability`); `connect()` refuses an
option a backend cannot honour instead of ignoring it. Every other list of
schemes in the package, message and help text is read from `COORDINATORS`.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from typing import Any

from stockade.core.errors import InvalidArgument

__all__ = [
    "Capability", "CoordinatorBackend", "PortOptions", "UrlOption", "COORDINATORS", "SCHEMES_PLANNED",
    "coordinator_backend", "load", "schemes_where",
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


def load(target: str) -> Any:
    """The object a ``"module:function"`` string names, its module imported now."""
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)


@dataclass(frozen=True, slots=True)
class PortOptions:
    """What `connect()` was given, for a backend's ``port`` opener (each checks the ones it takes).

    Attributes:
        url: the whole url; ``location`` is the part after ``scheme://``.
        capabilities: the backend's, from its entry.
        lock_delay_ms: C5, already refused where the backend does not declare `Capability.CLIENT_LOCK_DELAY`.
        timeout_ms, connect_timeout_ms, auth_token, tls_ca: as `connect()` took them (None: not given).
    """

    url: str
    location: str
    capabilities: frozenset[Capability]
    lock_delay_ms: int = 0
    timeout_ms: int | None = None
    connect_timeout_ms: int | None = None
    auth_token: str | None = None
    tls_ca: Any = None

    def refuse(self, *names: str) -> None:
        """Raise `InvalidArgument` for the first of ``names`` given: an option this backend does not take.

        Raises:
            InvalidArgument: field is the option; the message names the schemes that take it.
        """
        for name in names:
            if getattr(self, name) is not None:
                takers = schemes_where(remote=True) if name.endswith("timeout_ms") else ["http", "https"]
                raise InvalidArgument(name, f"applies only to {', '.join(f'{s}://' for s in takers)} urls")


@dataclass(frozen=True, slots=True)
class UrlOption:
    """A query parameter a backend's url takes (``sqlite:///coord.db?process=host``).

    Attributes:
        name: the parameter.
        values: the values it takes; the first is the default (the url without the parameter).
        ports: ``(value, "module:function")`` pairs: with that value the url is served by that port opener
            (``(PortOptions) -> port``, in an ``_async`` folder) instead of the backend's engine or port.
        summary: one line for docs and errors.
    """

    name: str
    values: tuple[str, ...]
    ports: tuple[tuple[str, str], ...] = ()
    summary: str = ""


#: The options only a backend reached over the network takes.
REMOTE_OPTIONS = ("timeout_ms", "connect_timeout_ms", "auth_token", "tls_ca")


@dataclass(frozen=True, slots=True)
class CoordinatorBackend:
    """One url scheme.

    Attributes:
        scheme: the url scheme.
        summary: one line for docs and errors.
        capabilities: what it guarantees or accepts.
        engine: ``"module:function"`` of ``(location, policy) -> LeaseEngine``, for a backend run in
            process over the lease engine; None when it has a port of its own.
        port: ``"module:function"`` of ``(PortOptions) -> port``, in the backend's ``_async`` folder;
            None when the engine port serves it.
        served: a `stockade serve` can sit in front of it (``--coordinator``); not for another
            server (a loop) nor for this process's memory.
        remote: the client reaches it over the network: it takes ``timeout_ms``, ``connect_timeout_ms``
            (and, where the port says so, ``auth_token`` and ``tls_ca``).
        store: ``"module:function"`` of ``(PortOptions, *, cluster_id, keys) -> store port`` for a backend
            that also serves a fenced store (a `stockade serve`); opened by `stockade.open_store`.
        beside: ``"module:function"`` of ``(location) -> coordinator | None``: the open in-process coordinator
            of that location, whose keys and last issued tokens a store of the same url uses (``memory://``).
        waits_in_one_call: why a wait until granted (``wait_ms=None``) is one call of its port, in words;
            None for a backend whose server caps each request's wait (the client resumes it by ticket).
        query: the url query parameters it takes (`UrlOption`); a url with any other is refused. A backend
            with none leaves a ``?`` in its location to its own opener (libpq, ZooKeeper).
        test_url: a fresh url of this backend for one test, as a `str.format` template whose fields are
            pytest fixture names (``"{tmp_path.name}"``, ``"{etcd_cluster.url}"``), read by the project's
            tests/conftest.py ``coord_url``; None: the tests reach this backend under another scheme of its
            folder.
    """

    scheme: str
    summary: str
    capabilities: frozenset[Capability]
    engine: str | None = None
    port: str | None = None
    served: bool = True
    remote: bool = True
    store: str | None = None
    beside: str | None = None
    waits_in_one_call: str | None = None
    query: tuple[UrlOption, ...] = ()
    test_url: str | None = None

    def __post_init__(self) -> None:
        # C4 is part of the contract, not an option: a backend without it is not a coordinator.
        if Capability.FIFO_WAIT not in self.capabilities:
            raise ValueError(f"backend {self.scheme!r} must serve waiters in FIFO order")
        if (self.engine is None) == (self.port is None):
            raise ValueError(f"backend {self.scheme!r} names an engine or a port, one of the two")
        ports = [target for option in self.query for _, target in option.ports]
        if any("._async." not in target for target in [*ports, *([self.port] if self.port else [])]):
            raise ValueError(f"backend {self.scheme!r}: its port is the async source ``…._async.…:function``")

    @property
    def folder(self) -> str:
        """The backend's folder under ``coordinators/`` (schemes that share one are one backend)."""
        return (self.port or self.engine or "").split(":")[0].split(".")[2]

    def open_port(self, twin: str, options: PortOptions) -> Any:
        """Open this backend's own port; ``twin`` is ``"_async"`` or ``"_sync"`` (the generated one).

        Raises:
            InvalidArgument: a bad location or option; BackendUnavailable: not reachable, or its driver is
            not installed.
        """
        if self.port is None:
            raise ValueError(f"backend {self.scheme!r} is served by the engine port")
        return load(self.port.replace("._async.", f".{twin}.", 1))(options)

    def open_query_port(self, twin: str, target: str, options: PortOptions) -> Any:
        """Open the port ``target`` (from `query_port`); ``twin`` as for `open_port`."""
        return load(target.replace("._async.", f".{twin}.", 1))(options)

    def open_store(self, twin: str, options: PortOptions, *, cluster_id: str | None, keys: object) -> Any:
        """Open the fenced store this backend serves; ``twin`` as for `open_port`."""
        if self.store is None:
            raise ValueError(f"backend {self.scheme!r} serves no store")
        return load(self.store.replace("._async.", f".{twin}.", 1))(options, cluster_id=cluster_id, keys=keys)

    def url_query(self, location: str, field: str = "url") -> tuple[str, dict[str, str]]:
        """``location`` without its query, and every parameter of `query` (its default where not given).

        Raises:
            InvalidArgument: a parameter this backend does not take, one given twice, or a value it does not
                take (one line, naming what it takes). Nothing was opened.
        """
        if not self.query:
            return location, {}
        path, _, text = location.partition("?")
        given: dict[str, str] = {}
        for pair in text.split("&") if text else ():
            name, _, value = pair.partition("=")
            option = next((o for o in self.query if o.name == name), None)
            if option is None:
                takes = "; ".join(f"{o.name}={'|'.join(o.values)}" for o in self.query)
                raise InvalidArgument(field, f"{self.scheme}:// takes no query parameter {name[:40]!r} "
                                             f"(it takes {takes})")
            if name in given:
                raise InvalidArgument(field, f"{self.scheme}:// query parameter {name!r} is given twice")
            if value not in option.values:
                raise InvalidArgument(field, f"{self.scheme}:// query parameter {name} must be "
                                             f"{' or '.join(option.values)}, got {value[:40]!r}")
            given[name] = value
        return path, {o.name: given.get(o.name, o.values[0]) for o in self.query}

    def with_default(self, url: str, name: str, value: str) -> str:
        """``url`` with ``name=value`` added unless the url gives ``name`` (``stockade serve --coordinator
        sqlite:///F`` owns F in its own process: ``process=embedded``); the url is not otherwise checked here."""
        if not any(o.name == name for o in self.query):
            raise ValueError(f"backend {self.scheme!r} takes no query parameter {name!r}")
        query = url.partition("?")[2]
        if any(pair.partition("=")[0] == name for pair in query.split("&") if pair):
            return url
        joint = "" if url.endswith(("?", "&")) else "&" if "?" in url else "?"
        return f"{url}{joint}{name}={value}"

    def query_port(self, params: dict[str, str]) -> str | None:
        """The ``"module:function"`` of the port that serves a url with ``params`` (`UrlOption.ports`), or None."""
        for option in self.query:
            found = dict(option.ports).get(params.get(option.name, option.values[0]))
            if found is not None:
                return found
        return None

    def open_engine(self, location: str, policy: Any) -> Any:
        """Open this backend's lease engine (`stockade.core.engine.LeaseEngine`)."""
        if self.engine is None:
            raise ValueError(f"backend {self.scheme!r} has a port of its own")
        return load(self.engine)(location, policy)


_DURABLE_REMOTE = frozenset({Capability.FIFO_WAIT, Capability.DURABLE_TOKENS, Capability.NATIVE_WAIT})
_DENSE = frozenset({Capability.DENSE_TOKENS})
_POSTGRES = frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY, Capability.DURABLE_TOKENS,
                       Capability.NATIVE_WAIT}) | _DENSE
_ZOOKEEPER = _DURABLE_REMOTE | {Capability.CLIENT_LOCK_DELAY}
_PG_WAIT = "PostgreSQL: one waiter row, woken by NOTIFY and polled in one call, no per-request cap"
_ZK_WAIT = "ZooKeeper: one sequential node, watched in one call, no per-request cap"

COORDINATORS: dict[str, CoordinatorBackend] = {
    backend.scheme: backend
    for backend in (
        CoordinatorBackend(
            "sqlite", "one SQLite file per host, owned by its host coordinator process (or in each process)",
            frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY, Capability.DURABLE_TOKENS}) | _DENSE,
            engine="stockade.coordinators.sqlite.signed:open_engine", remote=False,
            waits_in_one_call="the SQLite file: one waiter row, polled by its own process, no per-request cap",
            query=(UrlOption(
                "process", ("host", "embedded"),
                ports=(("host", "stockade.coordinators.http._async.host:open_host_port"),),
                summary="host (the default): one coordinator process per host owns the file, reached over the "
                        "Unix socket FILE.sock, started on demand; embedded: this process writes the file itself "
                        "(docs/coordinator-files.md)",
            ),),
            test_url="sqlite:///{tmp_path}/coord.db?process=embedded",  # the in-process engine (the conformance
            # suite's "embedded"); the host process is a `stockade serve`, which the "http" parameter runs
        ),
        CoordinatorBackend(
            "memory", "in this process only; tokens do not survive it (tests, examples)",
            frozenset({Capability.FIFO_WAIT, Capability.CLIENT_LOCK_DELAY}) | _DENSE,
            engine="stockade.coordinators.memory:open_engine", served=False, remote=False,
            beside="stockade.coordinators.memory:find_named",
            waits_in_one_call="in-process engine: one waiter, polled in one call, no per-request cap",
            test_url="memory://{tmp_path.name}",
        ),
        CoordinatorBackend(
            "postgresql", "PostgreSQL tables (libpq url, multi-host with target_session_attrs=read-write)",
            _POSTGRES, port="stockade.coordinators.postgres._async.port:open_port", remote=False,
            waits_in_one_call=_PG_WAIT, test_url="{pg_coord_url}",  # a fresh database per test
        ),
        CoordinatorBackend(
            "postgres", "PostgreSQL tables (libpq url, multi-host with target_session_attrs=read-write)",
            _POSTGRES, port="stockade.coordinators.postgres._async.port:open_port", remote=False,
            waits_in_one_call=_PG_WAIT,
        ),
        CoordinatorBackend("http", "a stockade serve", _DURABLE_REMOTE | _DENSE,
                           port="stockade.coordinators.http._async.open:open_port", served=False,
                           store="stockade.coordinators.http._async.open:open_store_port",
                           test_url="{http_server.url}"),  # a stockade serve per test
        CoordinatorBackend("https", "a stockade serve over TLS", _DURABLE_REMOTE | _DENSE,
                           port="stockade.coordinators.http._async.open:open_port", served=False,
                           store="stockade.coordinators.http._async.open:open_store_port"),
        CoordinatorBackend("etcd", "an etcd 3.4+ cluster: leases and watches, tokens from create revisions",
                           _DURABLE_REMOTE | {Capability.CLIENT_LOCK_DELAY},
                           port="stockade.coordinators.etcd._async.open:open_port",
                           waits_in_one_call="etcd: one queue key (its create revision), watched in one call, "
                                             "no per-request cap",
                           test_url="{etcd_cluster.url}/{tmp_path.name}"),  # a session cluster, a namespace per test
        # Tokens are czxids, not dense.
        CoordinatorBackend("zookeeper", "a ZooKeeper 3.5+ ensemble: ephemeral sequential nodes, tokens from czxids",
                           _ZOOKEEPER, port="stockade.coordinators.zookeeper._async.port:open_port",
                           waits_in_one_call=_ZK_WAIT,
                           test_url="{zk_ensemble.url}/{tmp_path.name}"),  # a session ensemble, a chroot per test
        CoordinatorBackend("zk", "a ZooKeeper 3.5+ ensemble: ephemeral sequential nodes, tokens from czxids",
                           _ZOOKEEPER, port="stockade.coordinators.zookeeper._async.port:open_port",
                           waits_in_one_call=_ZK_WAIT),
    )
}

#: Schemes named in the docs whose backends are not built yet.
SCHEMES_PLANNED: tuple[str, ...] = ()


def schemes_where(*, served: bool | None = None, remote: bool | None = None) -> list[str]:
    """The registered schemes, sorted, that are (or are not) served / remote; None: either."""
    return sorted(
        scheme for scheme, backend in COORDINATORS.items()
        if (served is None or backend.served == served) and (remote is None or backend.remote == remote)
    )


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
