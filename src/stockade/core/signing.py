"""Signed tokens: a keyed MAC that only the coordinator's keys can make (P3).

A coordinator signs every token it hands out; a resource that holds the same
keyring verifies the MAC before it compares the token with a mark, without
asking the coordinator. The MAC is HMAC-SHA256 (standard library only),
truncated to 128 bits, over the key id, cluster, value and scope::

    mac = base64url(HMAC-SHA256(secret[kid], "stk2\\0<kid>\\0<cluster>\\0<value>\\0<scope>")[:16])

Fields are joined with NUL, which none of them may contain, so no two tokens
share a message. A keyring holds one *current* key (the one that signs) and
any number of older keys kept for verification until a stated wall-clock time
(`SigningKey.verify_until_s`), so that tokens signed before a rotation stay
valid while their leases may still be held.

HMAC is symmetric: whoever can verify can also sign. A resource given the
keyring is trusted like the coordinator (docs/tokens.md says what an
asymmetric scheme would change). Pure: the wall clock is passed in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from binascii import b2a_base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from stockade.core.errors import InvalidArgument
from stockade.core.tokens import FencingToken, validate_cluster_id

__all__ = ["TokenSigner", "SigningKey", "Keyring", "SECRET_BYTES", "MAC_BYTES", "mac_of", "FORGED_DETAILS"]

#: Bytes of a key's secret (256 bits, the size of HMAC-SHA256's block output).
SECRET_BYTES = 32
#: Bytes of the MAC a token carries (128 bits, as HMAC-SHA256-128 in RFC 4868).
MAC_BYTES = 16

#: Why a token failed verification (the ``detail`` of its rejection).
FORGED_DETAILS = ("unsigned", "unknown-key", "retired-key", "bad-mac", "above-issued")


class TokenSigner(Protocol):
    """What a coordinator signs the tokens it hands out with (`Keyring`-backed, in `stockade.keys`)."""

    def sign(self, token: FencingToken) -> FencingToken:
        """``token`` with a key id and a MAC."""
        ...


def _check_kid(kid: object) -> str:
    if not isinstance(kid, str) or len(kid) != 8 or any(c not in "0123456789abcdef" for c in kid):
        raise InvalidArgument("kid", "must be 8 lowercase hex digits")
    return kid


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One key of a keyring.

    Attributes:
        kid: its id, 8 lowercase hex digits, carried in every token it signs.
        secret: the HMAC key, `SECRET_BYTES` random bytes.
        created_s: when it was made (unix seconds; informational).
        verify_until_s: None while it may be current; after a rotation, the
            wall-clock time (unix seconds) after which its tokens are refused.
    """

    kid: str
    secret: bytes = b""
    created_s: int = 0
    verify_until_s: int | None = None

    def __post_init__(self) -> None:
        _check_kid(self.kid)
        if not isinstance(self.secret, bytes) or len(self.secret) != SECRET_BYTES:
            raise InvalidArgument("secret", f"must be {SECRET_BYTES} bytes")

    def __repr__(self) -> str:  # never show the secret
        return f"SigningKey(kid={self.kid!r}, verify_until_s={self.verify_until_s!r})"


def mac_of(secret: bytes, kid: str, cluster: str, value: int, scope: str) -> str:
    """The MAC of one token under one key, as carried in the encoded token."""
    message = f"stk2\0{kid}\0{cluster}\0{value}\0{scope}".encode("ascii")
    digest = hmac.digest(secret, message, hashlib.sha256)[:MAC_BYTES]  # the one-shot C path
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


_BLOCK_BYTES = 64  # SHA-256's block
_URLSAFE = bytes.maketrans(b"+/", b"-_")  # base64 -> base64url
_INNER_PAD = bytes(x ^ 0x36 for x in range(256))
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))


def _pads(secret: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer hashes with ``secret``'s pads already absorbed (RFC 2104, section 2).

    `_mac_with` copies them for each MAC: the same MAC as `mac_of`, about 1 us
    instead of 7 here (the one-shot ``hmac.digest`` sets up OpenSSL's HMAC,
    digest lookup included, on every call).
    """
    if len(secret) > _BLOCK_BYTES:
        secret = hashlib.sha256(secret).digest()
    key = secret.ljust(_BLOCK_BYTES, b"\0")
    return hashlib.sha256(key.translate(_INNER_PAD)), hashlib.sha256(key.translate(_OUTER_PAD))


def _mac_with(pads: tuple[Any, Any], kid: str, cluster: str, value: int, scope: str) -> str:
    """`mac_of` under the key whose `_pads` these are."""
    inner, outer = pads[0].copy(), pads[1].copy()
    inner.update(f"stk2\0{kid}\0{cluster}\0{value}\0{scope}".encode("ascii"))
    outer.update(inner.digest())
    # `base64.urlsafe_b64encode` written out (its two Python calls are a fifth of a MAC's).
    return b2a_base64(outer.digest()[:MAC_BYTES], newline=False).translate(_URLSAFE).rstrip(b"=").decode("ascii")


class Keyring:
    """The keys of one coordinator cluster: the current one signs, all unexpired ones verify.

    Args:
        cluster_id: the cluster whose tokens these keys sign.
        keys: every key kept; exactly one has ``verify_until_s`` None (the current one).

    Raises:
        InvalidArgument: no current key, several, or duplicate key ids.
    """

    __slots__ = ("cluster_id", "keys", "current", "_by_kid", "_pads")

    def __init__(self, cluster_id: str, keys: Iterable[SigningKey]) -> None:
        self.cluster_id = validate_cluster_id(cluster_id, "cluster_id")
        self.keys = tuple(keys)
        self._by_kid = {key.kid: key for key in self.keys}
        if len(self._by_kid) != len(self.keys):
            raise InvalidArgument("keys", "key ids must be unique")
        current = [key for key in self.keys if key.verify_until_s is None]
        if len(current) != 1:
            raise InvalidArgument("keys", f"a keyring has exactly one current key, got {len(current)}")
        self.current = current[0]
        self._pads = {key.kid: _pads(key.secret) for key in self.keys}

    def __repr__(self) -> str:
        return f"Keyring(cluster_id={self.cluster_id!r}, kids={[k.kid for k in self.keys]!r})"

    def kids(self) -> tuple[str, ...]:
        return tuple(self._by_kid)

    def sign(self, token: FencingToken) -> FencingToken:
        """``token`` with the current key's id and MAC.

        Raises:
            InvalidArgument: the token belongs to another cluster.
        """
        if token.cluster != self.cluster_id:
            raise InvalidArgument("token", "belongs to another cluster than this keyring")
        kid = self.current.kid
        mac = _mac_with(self._pads[kid], kid, token.cluster, token.value, token.scope)
        # Not checked again: a token's fields are valid, its key's id was checked, and the MAC is made here.
        return FencingToken.prevalidated(token.cluster, token.scope, token.value, kid, mac)

    def verify(self, token: FencingToken, now_s: float) -> str | None:
        """None when ``token`` carries a right MAC by a key still valid at ``now_s``; else why not.

        The answer is one of `FORGED_DETAILS` (never the expected MAC). A token
        of another cluster is checked against this cluster's keys and fails
        as ``unknown-key`` or ``bad-mac``.
        """
        if not token.mac:
            return "unsigned"
        key = self._by_kid.get(token.kid)
        if key is None:
            return "unknown-key"
        if key.verify_until_s is not None and now_s >= key.verify_until_s:
            return "retired-key"
        expected = _mac_with(self._pads[key.kid], key.kid, token.cluster, token.value, token.scope)
        if not hmac.compare_digest(expected, token.mac):
            return "bad-mac"
        return None
