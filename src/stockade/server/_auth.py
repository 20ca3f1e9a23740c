"""Optional bearer-token authentication, each token limited to scopes if its line says so.

Tokens are read from a file, one per line (blank lines and ``#`` comments are
skipped). A line is a token, optionally followed by the scopes it may touch,
separated by spaces::

    # token                          scopes (none: every scope and every route)
    9f3c0e4d2b7a41d8a6c5e1f0b2d3c4e5
    reports-team-2f6a9c1d7e8b0a4f    reports.* billing
    ci-runner-7d1e2f3a4b5c6d7e8f9a   ci-*

A scope pattern ending in ``*`` covers every scope that starts with what comes
before it; any other pattern is one scope name (the scope rules of
`stockade.core.limits`, so ``*`` alone covers every scope). A token limited to
scopes may call the routes of those scopes (acquire, inspect, the store
and its transactions, the high-water mark), renew and release leases by id (a lease id is itself the
capability, and only an acquire on an allowed scope hands one out),
``/v1/cluster`` and ``/openapi.json``; it is refused (403) the routes that
show every scope: ``/v1/locks``, ``/v1/fence-floors``, ``/metrics`` and ``/``, and the
administrators' ``/v1/admin/verify-keys`` (the keyring, which can mint tokens).

Only the tokens' SHA-256 digests are kept, and a presented token is compared
with every digest in constant time, so neither the timing nor the answer (a
bare 401) tells a caller how close it came.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path
from urllib.parse import unquote_to_bytes

from stockade.core.errors import InvalidArgument
from stockade.core.limits import SCOPE_BYTES_MAX, SCOPE_CHARS
from stockade.server._http import Response, problem
from stockade.wire.routes import ROUTES, match

__all__ = ["BearerAuth", "load_tokens", "AUTH_TOKEN_CHARS_MIN", "AUTH_TOKEN_CHARS_MAX", "AUTH_TOKENS_MAX",
           "SCOPE_PATTERNS_MAX"]

AUTH_TOKEN_CHARS_MIN = 16
AUTH_TOKEN_CHARS_MAX = 512
AUTH_TOKENS_MAX = 1000
SCOPE_PATTERNS_MAX = 100  # per token

_PATTERN = re.compile(f"[{SCOPE_CHARS}]{{0,{SCOPE_BYTES_MAX}}}\\*?")  # a scope's prefix, then * or not
# Routes a scope-limited token may call without a scope in the path.
_UNSCOPED_ALLOWED = frozenset({"renew", "release", "cluster", "openapiDocument"})
_OPEN_PATHS = frozenset(route.path for route in ROUTES if not route.auth)
_CHALLENGE = [("WWW-Authenticate", 'Bearer realm="stockade"')]


def load_tokens(path: str | os.PathLike[str]) -> list[str]:
    """Read and validate the token file: one entry per token, ``"TOKEN [PATTERN ...]"``.

    Raises:
        InvalidArgument: unreadable file, no tokens, a token that is too short,
            too long, or not printable ASCII without spaces, or a bad scope pattern.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument("auth_tokens", f"cannot read {path}: {exc}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidArgument("auth_tokens", f"{path} line {line}: not ASCII (byte {data[exc.start]:#04x})") from None
    # (line number, entry): an error names the line a reader opens the file at, comments and blanks counted
    numbered = [(number, " ".join(line.split())) for number, line in enumerate(text.split("\n"), 1)]
    numbered = [(number, e) for number, e in numbered if e and not e.startswith("#")]
    if not numbered:
        raise InvalidArgument("auth_tokens", f"{path} holds no tokens")
    if len(numbered) > AUTH_TOKENS_MAX:
        raise InvalidArgument("auth_tokens", f"at most {AUTH_TOKENS_MAX} tokens")
    for number, entry in numbered:
        _parse(entry, f"{path} line {number}")
    return [entry for _, entry in numbered]


def _parse(entry: str, where: str) -> tuple[str, tuple[str, ...] | None]:
    """``(token, patterns)``; patterns None: every scope and route. ``where`` names the entry in errors."""
    token, *patterns = entry.split()
    if not AUTH_TOKEN_CHARS_MIN <= len(token) <= AUTH_TOKEN_CHARS_MAX or not all(
        "\x21" <= c <= "\x7e" for c in token
    ):
        raise InvalidArgument(
            "auth_tokens",
            f"{where}: the token must be {AUTH_TOKEN_CHARS_MIN}..{AUTH_TOKEN_CHARS_MAX} printable ASCII characters",
        )
    if len(patterns) > SCOPE_PATTERNS_MAX:
        raise InvalidArgument("auth_tokens", f"{where}: at most {SCOPE_PATTERNS_MAX} scope patterns")
    for pattern in patterns:
        if not _PATTERN.fullmatch(pattern) or pattern in ("",):
            raise InvalidArgument("auth_tokens", f"{where}: {pattern!r} is not a scope or a scope prefix "
                                  "followed by *")
    return token, tuple(patterns) if patterns and "*" not in patterns else None


def scope_allowed(scope: str, patterns: tuple[str, ...]) -> bool:
    return any(scope.startswith(p[:-1]) if p.endswith("*") else scope == p for p in patterns)


class BearerAuth:
    """Checks ``Authorization: Bearer <token>`` against the configured tokens, and their scopes."""

    def __init__(self, entries: list[str]) -> None:
        parsed = [_parse(entry, f"auth token {number}") for number, entry in enumerate(entries, 1)]
        self._digests = [hashlib.sha256(token.encode("ascii")).digest() for token, _ in parsed]
        self._patterns = [patterns for _, patterns in parsed]

    def _find(self, authorization: str | None) -> int:
        """The index of the presented token, or -1 (constant time over the tokens)."""
        if authorization is None or len(authorization) > 7 + AUTH_TOKEN_CHARS_MAX:
            return -1
        scheme, _, presented = authorization.partition(" ")
        digest = hashlib.sha256(presented.strip().encode("latin-1")).digest()
        found = -1
        for index, known in enumerate(self._digests):  # no early exit: every request costs the same
            if hmac.compare_digest(digest, known):
                found = index
        return found if scheme.lower() == "bearer" else -1

    def allows(self, authorization: str | None) -> bool:
        return self._find(authorization) >= 0

    def entries(self) -> list[tuple[bytes, tuple[str, ...] | None]]:
        """``(SHA-256 digest of the token, patterns)`` of each token, in file order (the dashboard's sessions)."""
        return list(zip(self._digests, self._patterns, strict=True))

    def reach(self, authorization: str | None) -> tuple[bool, tuple[str, ...] | None]:
        """``(known, patterns)`` of the presented token: patterns None means every scope and route.

        The dashboard exchanges a known token for a session limited the same way.
        """
        index = self._find(authorization)
        return (False, ()) if index < 0 else (True, self._patterns[index])

    def index_of(self, authorization: str | None) -> int:
        """The presented token's position in the file, or -1 (constant time over the tokens)."""
        return self._find(authorization)

    def refusal(self, method: str, raw_path: str, headers: dict[str, str], has_body: bool) -> Response | None:
        """What to answer a request instead of serving it, decided from its headers alone.

        An unknown token gets 401 here only when the request has a body (so that
        the body is never read); without one, the application answers the same 401.
        A known token outside its scopes gets 403.
        """
        if raw_path in _OPEN_PATHS:
            return None
        index = self._find(headers.get("authorization"))
        if index < 0:
            return problem("unauthorized", headers=_CHALLENGE) if has_body else None
        patterns = self._patterns[index]
        if patterns is None:
            return None
        found = match(raw_path)
        if found is None:
            return None  # 404 from the application
        route = next(iter(found.methods.values()))
        if "scope" in route.path_params:
            raw = found.params[route.path_params.index("scope")]
            try:
                scope = unquote_to_bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                scope = ""
            if scope_allowed(scope, patterns):
                return None
        elif route.operation_id in _UNSCOPED_ALLOWED:
            return None
        return problem("unauthorized", "this token does not cover the scope or route", status=403)
