"""A short memory of the tokens an adapter handle (a fenced directory, a SQLite fence) already validated and verified.

A token is validated (`stockade.resources._inputs.coerce_token`) and its MAC
checked (`stockade.resources._verify.Verification`) on every write; under one
lease that is the same token each time, and the two cost about as much CPU as
the rest of the fence together (~25 µs of ~35 µs on this project's test
machine). So a handle remembers, for `TTL_S`, the tokens that passed: a token
whose every field (cluster, scope, value, key id, MAC; or its encoded string)
equals a remembered one is the same token and passed the same checks.

What this changes: a key retired from the keyring is refused up to `TTL_S`
later than without the memory (a `stockade.keys.KeyFile` already looks at its
file at most once per second). The fence rule itself (R1, R2) runs on every
write; only the token's own validity is remembered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stockade.core.tokens import FencingToken
from stockade.resources._inputs import coerce_token

__all__: list[str] = []  # private to the adapters (files, sqlite_db)

TTL_S = 1.0
REMEMBERED_MAX = 256


class VerifiedTokens:
    """Validated tokens that passed ``forged`` (returned None), each for `TTL_S` seconds. Thread-safe (GIL)."""

    def __init__(
        self, forged: Callable[[FencingToken], str | None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._forged = forged
        self._clock = clock
        self._passed: dict[object, tuple[FencingToken, float]] = {}

    def check(self, token: object) -> tuple[FencingToken, str | None]:
        """The validated token and why it is forged (None: it verified).

        Raises:
            InvalidArgument: a malformed token (never remembered).
        """
        key: object
        if type(token) is FencingToken:
            key = (token.cluster, token.scope, token.value, token.kid, token.mac)
        elif type(token) is str:
            key = token
        else:
            key = None
        now = self._clock()
        if key is not None:
            found = self._passed.get(key)
            if found is not None and found[1] > now:
                return found[0], None
        checked = coerce_token(token)
        why = self._forged(checked)
        if why is None and key is not None:
            if len(self._passed) >= REMEMBERED_MAX:
                self._passed.clear()
            self._passed[key] = (checked, now + TTL_S)
        return checked, why
