"""A short memory of the tokens an adapter handle (a fenced directory, a SQLite fence, a Redis fence) already
validated and verified.

A token is validated (`stockade.resources._inputs.coerce_token`) and its MAC
checked (`stockade.resources._verify.Verification`) on every write; under one
lease that is the same token each time, and the two cost about as much CPU as
the rest of the fence together (~25 µs of ~35 µs on this project's test
machine). So a handle remembers, for `TTL_S`, the tokens that passed: a token
whose every field (cluster, scope, value, key id, MAC; or its encoded string)
equals a remembered one is the same token and passed the same checks.

What this changes: nothing a token could tell. A remembered verdict is used only
while the verifier's keyring is the very one it was reached with (a
`stockade.keys.KeyFile` looks at its file as often as it does to verify, at most
`KeyFile.reload_check_s` apart: a key dropped or rotated out of the file ends the
memory of every token at that look, as it ends their verification), and while
the token's key is not past its ``verify_until_s`` by the verifier's own wall
clock (a retired key is refused at the same instant as without the memory).
`TTL_S` only bounds how long an entry is kept. The fence rule itself (R1, R2)
runs on every write; only the token's own validity is remembered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stockade.core.tokens import FencingToken
from stockade.resources._inputs import coerce_token
from stockade.resources._verify import Verification

__all__: list[str] = []  # private to the adapters (files, sqlite_db, redis)

TTL_S = 1.0
REMEMBERED_MAX = 256


class VerifiedTokens:
    """Validated tokens that passed ``verification.forged`` (returned None), each for at most `TTL_S`
    seconds and only under the keyring they passed with. Thread-safe (GIL)."""

    def __init__(self, verification: Verification, clock: Callable[[], float] = time.monotonic) -> None:
        self._verification = verification
        self._clock = clock
        #: key -> (the token, monotonic deadline, the keyring it passed with, its key's verify_until_s)
        self._passed: dict[object, tuple[FencingToken, float, object, float | None]] = {}

    @property
    def cluster_id(self) -> str | None:
        """The cluster of the verifier's keys (None: no verifier)."""
        verifier = self._verification.verifier
        return None if verifier is None else verifier.cluster_id

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
        verifier = self._verification.verifier
        keyring, wall_s = verifier.in_force() if verifier is not None else (None, 0.0)
        if key is not None:
            found = self._passed.get(key)
            if (found is not None and found[1] > now and found[2] is keyring
                    and (found[3] is None or wall_s < found[3])):
                return found[0], None
        checked = coerce_token(token)
        why = self._verification.forged(checked)
        if why is None and key is not None:
            if len(self._passed) >= REMEMBERED_MAX:
                self._passed.clear()
            until = None
            if keyring is not None:
                until = next((k.verify_until_s for k in keyring.keys if k.kid == checked.kid), None)
            self._passed[key] = (checked, now + TTL_S, keyring, until)
        return checked, why
