"""Non-I/O pieces shared by the sync and async clients (not generated)."""

from __future__ import annotations

import contextvars
import os
import socket
from pathlib import Path
from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.tokens import FencingToken

__all__ = ["CURRENT_LEASE", "resolve_token", "default_holder", "sqlite_path", "lost_margin_ms", "SCHEMES_PLANNED"]

# The lease of the innermost `lock()` block in this thread or task (K1): writes
# without an explicit token use it.
CURRENT_LEASE: contextvars.ContextVar[Any] = contextvars.ContextVar("stockade_current_lease", default=None)

SCHEMES_PLANNED = ("http", "https", "etcd", "zk", "postgresql")


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
    lease_token = getattr(token, "token", None)
    if isinstance(lease_token, FencingToken) and hasattr(token, "raise_if_lost"):
        token.raise_if_lost()
        return lease_token
    raise InvalidArgument("token", f"must be a FencingToken, an encoded token or a lease, got {type(token).__name__}")


def default_holder() -> str:
    """``host:pid``, shown in status; printable ASCII by construction."""
    host = "".join(c for c in socket.gethostname() if c.isascii() and c.isprintable() and c != " ")[:100] or "host"
    return f"{host}:{os.getpid()}"


def lost_margin_ms(ttl_ms: int) -> int:
    """Subtracted from a lease's local deadline for clock drift and scheduling (K2)."""
    return max(5, ttl_ms // 10)


def sqlite_path(url: object, field: str = "url") -> Path | None:
    """The file of a ``sqlite://PATH`` url, or None for a planned scheme not built yet.

    ``sqlite:///var/lib/stockade/coord.db`` is absolute, ``sqlite://data/coord.db`` relative.

    Raises:
        InvalidArgument: not a url stockade knows.
    """
    if not isinstance(url, str):
        raise InvalidArgument(field, f"must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidArgument(field, "must be a url such as sqlite:///path/to/coord.db")
    if scheme == "sqlite":
        if not rest or "\x00" in rest:
            raise InvalidArgument(field, "sqlite url needs a file path: sqlite:///path/to/file.db")
        return Path(rest)
    if scheme in SCHEMES_PLANNED:
        raise InvalidArgument(field, f"scheme {scheme!r} is planned but not available in this version")
    raise InvalidArgument(field, f"unknown scheme {scheme!r}; supported: sqlite")
