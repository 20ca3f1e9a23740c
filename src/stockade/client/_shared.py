"""Non-I/O pieces shared by the sync and async clients (not generated)."""

from __future__ import annotations

import contextvars
import ipaddress
import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from stockade.core.errors import InvalidArgument
from stockade.core.limits import validate_int
from stockade.core.tokens import FencingToken
from stockade.core.values import Grant  # defined with the other values a port answers; re-exported for the ports
from stockade.transport.http11 import HTTPEndpoint  # what `http_endpoint` answers; re-exported

if TYPE_CHECKING:
    import ssl

__all__ = [
    "Grant",
    "Leased",
    "CURRENT_LEASE",
    "resolve_token",
    "default_holder",
    "lost_margin_ms",
    "HTTPEndpoint",
    "http_endpoint",
    "TIMEOUT_MS_DEFAULT",
    "TIMEOUT_MS_MAX",
    "CONNECT_TIMEOUT_MS_DEFAULT",
    "AUTH_TOKEN_ENV",
    "MAX_HOLD_MS_MAX",
]

# The lease of the innermost `lock()` block in this thread or task (K1): writes
# without an explicit token use it.
CURRENT_LEASE: contextvars.ContextVar[Leased | None] = contextvars.ContextVar("stockade_current_lease", default=None)


class Leased:
    """What a held lease is to a write, whichever client holds it (`Lease`, `AsyncLease` derive from it).

    A write given a lease takes its token after `raise_if_lost` (K1); a write given none walks the
    ``lock()`` blocks open in its context, innermost first, through ``_enclosing``.

    Attributes:
        scope: the scope held.
        token: the grant's fencing token.
    """

    scope: str
    token: FencingToken
    _enclosing: Leased | None = None  # the lease of the ``lock()`` block this one is nested in

    def raise_if_lost(self) -> None:
        """Raise `LeaseLost` if the lease is known to be lost (each client's lease says when)."""
        raise NotImplementedError


# Remote calls: every request has a deadline (no unbounded waits, C4). An acquire may take
# its ``wait_ms`` on top, since the server long-polls.
TIMEOUT_MS_DEFAULT = 10_000
TIMEOUT_MS_MAX = 600_000
CONNECT_TIMEOUT_MS_DEFAULT = 3_000
# The longest a lease's keepalive may be told to renew it (max_hold_ms): a week.
MAX_HOLD_MS_MAX = 7 * 24 * 3_600_000
# The bearer token, when none is passed to connect()/open_store().
AUTH_TOKEN_ENV = "STOCKADE_AUTH_TOKEN"
_AUTH_TOKEN_BYTES_MAX = 4096


def resolve_token(token: object) -> FencingToken:
    """The token a write carries: explicit (token, encoded string or lease) or the current lease's.

    Raises:
        InvalidArgument: no token and no lease in context, or a value of the wrong type.
        LeaseLost: the lease given (or in context) is known to be lost.
    """
    if token is None:
        token = CURRENT_LEASE.get()
        if token is None:
            raise InvalidArgument("token", "no token given and no lease held in this context")
    if isinstance(token, FencingToken):
        return token
    if isinstance(token, str):
        return FencingToken.decode(token)
    if isinstance(token, Leased):
        token.raise_if_lost()
        return token.token
    raise InvalidArgument("token", f"must be a FencingToken, an encoded token or a lease, got {type(token).__name__}")


_holder: tuple[int, str] = (-1, "")  # (pid, its default holder): worked out once per process (a fork has its own)


def default_holder() -> str:
    """``host:pid``, shown in status; printable ASCII by construction."""
    global _holder
    pid = os.getpid()
    if _holder[0] != pid:
        host = "".join(c for c in socket.gethostname() if c.isascii() and c.isprintable() and c != " ")[:100]
        _holder = (pid, f"{host or 'host'}:{pid}")
    return _holder[1]


def lost_margin_ms(ttl_ms: int) -> int:
    """Subtracted from a lease's local deadline for clock drift and scheduling (K2)."""
    return max(5, ttl_ms // 10)


def _http_schemes() -> list[str]:
    """The schemes of the HTTP remote (its registry entries)."""
    from stockade.coordinators.registry import COORDINATORS

    return sorted(scheme for scheme, backend in COORDINATORS.items() if backend.folder == "http")


def http_endpoint(
    url: str,
    *,
    timeout_ms: int | None = None,
    connect_timeout_ms: int | None = None,
    auth_token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
) -> HTTPEndpoint:
    """Parse ``http://host:port[/prefix]`` or ``https://...`` and the connection options.

    Args:
        url: the server; no user info, query or fragment.
        timeout_ms: per-request deadline, 1..600_000 (default 10_000).
        connect_timeout_ms: connect deadline, 1..600_000 (default 3_000).
        auth_token: bearer token; default ``$STOCKADE_AUTH_TOKEN`` if set.
        tls_ca: a CA bundle (PEM) to verify an ``https`` server by, instead of the system's.

    Raises:
        InvalidArgument: a malformed url or option.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument("url", f"malformed: {exc}") from None
    if parts.scheme not in (http := _http_schemes()):
        raise InvalidArgument("url", f"scheme must be {' or '.join(http)}, got {parts.scheme!r}")
    host = parts.hostname
    if not host:
        raise InvalidArgument("url", "needs a host: http://127.0.0.1:7390")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument("url", "must not carry user info; pass auth_token= instead")
    if parts.query or parts.fragment:
        raise InvalidArgument("url", "must not have a query or fragment")
    tls_on = parts.scheme == "https"
    port = port if port is not None else (443 if tls_on else 80)
    base_path = parts.path.rstrip("/")
    if any(c in base_path for c in " \r\n\t") or not base_path.isascii():
        raise InvalidArgument("url", "path prefix must be plain ASCII")
    try:
        bracketed = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        bracketed = host
    timeout_ms = validate_int("timeout_ms", TIMEOUT_MS_DEFAULT if timeout_ms is None else timeout_ms, 1, TIMEOUT_MS_MAX)
    connect_timeout_ms = validate_int(
        "connect_timeout_ms",
        CONNECT_TIMEOUT_MS_DEFAULT if connect_timeout_ms is None else connect_timeout_ms,
        1,
        TIMEOUT_MS_MAX,
    )
    from_environment = auth_token is None and bool(os.environ.get(AUTH_TOKEN_ENV))
    if auth_token is None:
        auth_token = os.environ.get(AUTH_TOKEN_ENV) or None
    if auth_token is not None:
        if (
            not isinstance(auth_token, str)
            or not 1 <= len(auth_token) <= _AUTH_TOKEN_BYTES_MAX
            or not all("\x21" <= c <= "\x7e" for c in auth_token)
        ):
            # Name where the value came from: a CLI user set the variable, not a parameter.
            raise InvalidArgument(f"${AUTH_TOKEN_ENV}" if from_environment else "auth_token",
                                  "must be 1..4096 characters of printable ASCII without spaces")
    if tls_ca is not None and not tls_on:
        raise InvalidArgument("tls_ca", "only applies to https:// urls")
    return HTTPEndpoint(
        host=host,
        port=port,
        base_path=base_path,
        tls=_tls_context(tls_ca) if tls_on else None,
        authority=f"{bracketed}:{port}",
        auth_token=auth_token,
        timeout_ms=timeout_ms,
        connect_timeout_ms=connect_timeout_ms,
    )


def _tls_context(tls_ca: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """An ``https://`` url's TLS context: the system's CAs, or ``tls_ca``'s.

    ssl is imported here, not with the module: an ``http://`` or Unix-socket client (``sqlite:///``,
    the default) never needs it, and it is about 5 ms of CPU of every process's start.

    Raises:
        InvalidArgument: ``tls_ca`` cannot be loaded.
    """
    import ssl

    try:
        return ssl.create_default_context(cafile=None if tls_ca is None else os.fspath(tls_ca))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument("tls_ca", f"cannot load CA bundle: {exc}") from None
