"""Step 0 of every fenced write: is the token one the coordinator issued? (P3; docs/tokens.md)

A store holds a verifier (`stockade.keys`: the coordinator's keyring, read
from its file or given in memory) and, where the coordinator lives in the same
process, ``issued``: the coordinator's last issued token of a scope. A token
that fails either check is refused as ``forged`` before it is compared with
anything (`stockade.core.fence.check_write`), so it changes nothing.
A store with neither checks nothing (legacy; docs/tokens.md says why that is unsafe).
"""

from __future__ import annotations

from collections.abc import Callable

from stockade.core.tokens import FencingToken
from stockade.keys import TokenVerifier, verifier_of

__all__ = ["Verification", "UNSIGNED"]

#: Pass as ``keys=`` to open a store that checks no MAC (legacy tokens; unsafe, docs/tokens.md).
UNSIGNED = "unsigned"


class Verification:
    """What a store checks a token's origin with (see the module docstring)."""

    verifier: TokenVerifier | None = None
    issued: Callable[[str], int] | None = None

    def use_keys(self, keys: object, cluster_id: str, issued: Callable[[str], int] | None = None) -> None:
        """Verify tokens with ``keys`` (None or `UNSIGNED`: no MAC check) and refuse values above ``issued``.

        Raises:
            InvalidArgument: keys of another cluster or of an unknown kind.
        """
        self.verifier = None if keys is None or keys == UNSIGNED else verifier_of(keys, cluster_id)
        self.issued = issued

    def forged(self, token: FencingToken) -> str | None:
        """Why ``token`` is not one the coordinator issued, or None (`stockade.core.signing.FORGED_DETAILS`)."""
        if self.verifier is not None:
            why = self.verifier.why_forged(token)
            if why is not None:
                return why
        if self.issued is not None and token.value > self.issued(token.scope):
            return "above-issued"
        return None
