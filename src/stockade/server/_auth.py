"""Optional bearer-token authentication.

Tokens are read from a file, one per line (blank lines and ``#`` comments are
skipped). Only their SHA-256 digests are kept, and a presented token is
compared with every digest in constant time, so neither the timing nor the
answer (a bare 401) tells a caller how close it came.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from stockade.core.errors import InvalidArgument

__all__ = ["BearerAuth", "load_tokens", "AUTH_TOKEN_CHARS_MIN", "AUTH_TOKEN_CHARS_MAX", "AUTH_TOKENS_MAX"]

AUTH_TOKEN_CHARS_MIN = 16
AUTH_TOKEN_CHARS_MAX = 512
AUTH_TOKENS_MAX = 1000


def load_tokens(path: str | os.PathLike[str]) -> list[str]:
    """Read and validate the token file.

    Raises:
        InvalidArgument: unreadable file, no tokens, or a token that is too short,
            too long, or not printable ASCII without spaces.
    """
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("auth_tokens", f"cannot read {path}: {exc}") from None
    tokens = [line.strip() for line in text.splitlines()]
    tokens = [t for t in tokens if t and not t.startswith("#")]
    if not tokens:
        raise InvalidArgument("auth_tokens", f"{path} holds no tokens")
    if len(tokens) > AUTH_TOKENS_MAX:
        raise InvalidArgument("auth_tokens", f"at most {AUTH_TOKENS_MAX} tokens")
    for number, token in enumerate(tokens, 1):
        if not AUTH_TOKEN_CHARS_MIN <= len(token) <= AUTH_TOKEN_CHARS_MAX or not all(
            "\x21" <= c <= "\x7e" for c in token
        ):
            raise InvalidArgument(
                "auth_tokens",
                f"token {number} must be {AUTH_TOKEN_CHARS_MIN}..{AUTH_TOKEN_CHARS_MAX} printable ASCII characters",
            )
    return tokens


class BearerAuth:
    """Checks ``Authorization: Bearer <token>`` against the configured tokens."""

    def __init__(self, tokens: list[str]) -> None:
        self._digests = [hashlib.sha256(t.encode("ascii")).digest() for t in tokens]

    def allows(self, authorization: str | None) -> bool:
        if authorization is None or len(authorization) > 7 + AUTH_TOKEN_CHARS_MAX:
            return False
        scheme, _, presented = authorization.partition(" ")
        digest = hashlib.sha256(presented.strip().encode("latin-1")).digest()
        matched = False
        for known in self._digests:  # no early exit: every request costs the same
            matched |= hmac.compare_digest(digest, known)
        return matched and scheme.lower() == "bearer"
