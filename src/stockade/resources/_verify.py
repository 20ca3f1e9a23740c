"""Step 0 of every fenced write: is the token one the coordinator issued? (P3, L2; docs/tokens.md)

A store holds a verifier (`stockade.keys`: the coordinator's keyring, read
from its file or given in memory) and, where it can see the coordinator,
``issued``: the coordinator's last issued token of a scope. A token that fails
either check is refused as ``forged`` before it is compared with anything
(`stockade.core.fence.check_write`), so it changes nothing.

Verification never turns itself off (L2): ``keys=None`` (or nothing) is
refused with `InvalidArgument`; only the word `UNSIGNED` opens a resource that
checks no MAC (legacy tokens; unsafe, docs/tokens.md says why). A resource
that remembers having verified (a store file, a fenced directory, a fenced
SQLite file, Redis, PostgreSQL) refuses `UNSIGNED` afterwards:
`refuse_unsigned_after_signed`.
"""

from __future__ import annotations

from collections.abc import Callable

import stockade.keys
from stockade.core.errors import InvalidArgument
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, TokenVerifier, ephemeral_keyring, verifier_of
from stockade.resources._issued import CoordinatorIssued

__all__ = ["Verification", "UNSIGNED", "TOKENLESS", "NO_KEYS", "check_keys_given", "refuse_unsigned_after_signed"]

#: Pass as ``keys=`` to open a resource that checks no MAC (legacy tokens; unsafe, docs/tokens.md).
UNSIGNED = "unsigned"

#: Pass as ``keys=`` to open a handle that admits no token at all (every one is refused as forged,
#: ``unknown-key``): for tools that only read, back up or raise floors (R4), on any resource,
#: including one that remembers verifying.
TOKENLESS = "tokenless"

#: What a resource says when it is given no keys (L2): the two ways to choose, in words.
NO_KEYS = ("no keys given: pass the coordinator's keys (coord.verify_keys(), a keyring path, a KeyFile or "
           "FixedKeys), or keys='unsigned' to check no MAC (unsafe: docs/tokens.md)")


def check_keys_given(keys: object) -> None:
    """Refuse ``keys=None`` (L2: None never means unsigned).

    Raises:
        InvalidArgument: ``keys`` is None.
    """
    if keys is None and not stockade.keys.LEGACY_NONE_MEANS_UNSIGNED:
        raise InvalidArgument("keys", NO_KEYS)


def refuse_unsigned_after_signed(resource: str, signed_before: bool, keys: object) -> None:
    """A resource that verified tokens once keeps verifying: `UNSIGNED` is refused on it (L2).

    Raises:
        InvalidArgument: ``keys`` is `UNSIGNED` and the resource remembers verifying (not under the test
            control `stockade.keys.LEGACY_NONE_MEANS_UNSIGNED`: before L2 nothing was remembered).
    """
    if signed_before and keys == UNSIGNED and not stockade.keys.LEGACY_NONE_MEANS_UNSIGNED:
        raise InvalidArgument("keys", f"{resource} has verified signed tokens before: it keeps verifying; "
                                      "pass the coordinator's keys (docs/tokens.md)")


class Verification:
    """What a store checks a token's origin with (see the module docstring)."""

    verifier: TokenVerifier | None = None
    issued: Callable[[str], int] | None = None

    def use_keys(self, keys: object, cluster_id: str, issued: Callable[[str], int] | None = None) -> None:
        """Verify tokens with ``keys`` (`UNSIGNED`: no MAC check) and refuse values above ``issued``.

        Raises:
            InvalidArgument: no keys (None), keys of another cluster or of an unknown kind.
        """
        check_keys_given(keys)
        if keys == TOKENLESS:  # a key no coordinator holds: every token is refused as unknown-key
            keys = FixedKeys(ephemeral_keyring(cluster_id))
            self.tokenless = True
        self.verifier = None if keys == UNSIGNED else verifier_of(keys, cluster_id)
        self.issued = issued

    tokenless = False

    @property
    def verifies(self) -> bool:
        """Whether token MACs are checked with the coordinator's keys (not `UNSIGNED`, not `TOKENLESS`)."""
        return self.verifier is not None and not self.tokenless

    def _issued_at_least(self, token: FencingToken) -> int:
        issued = self.issued
        assert issued is not None
        if isinstance(issued, CoordinatorIssued):  # reads the file only for a value above what it knows
            return issued(token.scope, token.value)
        return issued(token.scope)

    def forged(self, token: FencingToken) -> str | None:
        """Why ``token`` is not one the coordinator issued, or None (`stockade.core.signing.FORGED_DETAILS`)."""
        if self.verifier is not None:
            why = self.verifier.why_forged(token)
            if why is not None:
                return why
        if self.issued is not None and token.value > self._issued_at_least(token):
            return "above-issued"
        return None
