"""The fencing token: the product.

A token is ``(cluster, scope, value)``: the coordinator cluster that issued it,
the scope it orders, and an integer in ``1..2**63-1`` that strictly increases
per scope. Its encoded form is what clients carry (``STOCKADE_TOKEN``, the
``Fencing-Token`` header)::

    stk2.<cluster>.<value>.<kid>.<mac>.<scope>     (signed: what a coordinator issues)
    stk1.<cluster>.<value>.<scope>                 (unsigned: legacy, and what reads show)

``cluster`` is 16 lowercase hex digits and ``value`` is decimal without leading
zeros, so neither contains a dot; ``kid`` (8 lowercase hex digits) names the
coordinator key that signed the token and ``mac`` is its 128-bit keyed MAC in
unpadded base64url (`stockade.core.signing`), neither with a dot either; the
scope comes last because it may. ``kid`` and ``mac`` are not part of a token's
identity: two tokens are equal when cluster, scope and value are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stockade.core.errors import InvalidArgument, LimitExceeded
from stockade.core.limits import TOKEN_VALUE_MAX, TOKEN_VALUE_MIN, validate_int, validate_scope

__all__ = [
    "FencingToken",
    "validate_cluster_id",
    "CLUSTER_ID_HEX_DIGITS",
    "COUNTER_BITS",
    "COUNTER_MAX",
    "EPOCH_BITS",
    "EPOCH_MAX",
    "EPOCH_TICK_NS",
    "EPOCH_BASE_UNIX_S",
    "epoch_of",
    "epoch_floor",
    "epoch_tick",
    "next_epoch",
    "epoch_ready",
    "grant_base",
    "counter_exhausted",
]

CLUSTER_ID_HEX_DIGITS = 16
# How a `prevalidated` value is built: as the frozen dataclass's own ``__init__`` sets its fields.
_new = object.__new__
_set = object.__setattr__
_CLUSTER_RE = re.compile(r"[0-9a-f]{16}")
_VALUE_RE = re.compile(r"[1-9][0-9]{0,18}")
_PREFIX = "stk1"
_SIGNED_PREFIX = "stk2"
_KID_RE = re.compile(r"[0-9a-f]{8}")
_MAC_RE = re.compile(r"[A-Za-z0-9_-]{22}")
#: Characters of a key id and of a MAC in an encoded token.
KID_CHARS = 8
MAC_CHARS = 22
# prefix + cluster + max value digits + kid + mac + max scope + 5 dots
ENCODED_CHARS_MAX = len(_SIGNED_PREFIX) + 16 + 19 + KID_CHARS + MAC_CHARS + 200 + 5


def validate_cluster_id(cluster: object, field: str = "cluster") -> str:
    if type(cluster) is str and _CLUSTER_RE.fullmatch(cluster):
        return cluster  # the usual case: one match
    if not isinstance(cluster, str) or not _CLUSTER_RE.fullmatch(cluster):
        raise InvalidArgument(field, "must be 16 lowercase hex digits")
    return cluster


@dataclass(frozen=True, slots=True, order=False)
class FencingToken:
    """An issued fencing token. Frozen and validated: an invalid one cannot exist.

    Tokens of different scopes or clusters are not comparable; compare
    ``value`` only after checking both (the fence rule does this).
    """

    cluster: str
    scope: str
    value: int
    #: The id of the key that signed it ("" when unsigned).
    kid: str = field(default="", compare=False)
    #: Its MAC, unpadded base64url ("" when unsigned). Whether it is right is the verifier's question.
    mac: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        validate_cluster_id(self.cluster)
        validate_scope(self.scope)
        validate_int("token", self.value, TOKEN_VALUE_MIN, TOKEN_VALUE_MAX)
        if self.kid or self.mac:
            if not isinstance(self.kid, str) or not _KID_RE.fullmatch(self.kid):
                raise InvalidArgument("token", "key id must be 8 lowercase hex digits")
            if not isinstance(self.mac, str) or not _MAC_RE.fullmatch(self.mac):
                raise InvalidArgument("token", "mac must be 22 base64url characters")

    @classmethod
    def prevalidated(cls, cluster: str, scope: str, value: int, kid: str = "", mac: str = "") -> FencingToken:
        """The token of values checked already, built without checking them again: the trusted entry.

        Only for a caller whose values cannot be invalid: the grant rule (the cluster and
        scope of a checked `stockade.core.leases.AcquireRequest`, a value it bounded) and
        a keyring signing a token (the token's own fields, its key's checked id, the MAC
        it computed). Every other token is built by the constructor, which checks.
        """
        token = _new(cls)
        _set(token, "cluster", cluster)
        _set(token, "scope", scope)
        _set(token, "value", value)
        _set(token, "kid", kid)
        _set(token, "mac", mac)
        return token

    @property
    def signed(self) -> bool:
        """Whether it carries a key id and a MAC (not whether they are right)."""
        return bool(self.mac)

    def unsigned(self) -> FencingToken:
        """The same token without its MAC: safe to show, useless to write with where keys are checked."""
        return FencingToken(self.cluster, self.scope, self.value) if self.mac else self

    def encode(self) -> str:
        """The string form clients pass around; `decode` round-trips it (MAC included)."""
        if self.mac:
            return f"{_SIGNED_PREFIX}.{self.cluster}.{self.value}.{self.kid}.{self.mac}.{self.scope}"
        return f"{_PREFIX}.{self.cluster}.{self.value}.{self.scope}"

    @classmethod
    def decode(cls, text: object) -> FencingToken:
        """Parse an encoded token.

        Raises:
            InvalidArgument: ``text`` is not a well-formed token.
        """
        if not isinstance(text, str):
            raise InvalidArgument("token", f"must be an encoded token string, got {type(text).__name__}")
        if len(text) > ENCODED_CHARS_MAX:
            raise InvalidArgument("token", f"must be at most {ENCODED_CHARS_MAX} characters")
        kid = mac = ""
        if text.startswith(_SIGNED_PREFIX + "."):
            parts = text.split(".", 5)
            if len(parts) != 6:
                raise InvalidArgument("token", "must look like stk2.<cluster>.<value>.<kid>.<mac>.<scope>")
            _, cluster, value, kid, mac, scope = parts
        else:
            parts = text.split(".", 3)
            if len(parts) != 4 or parts[0] != _PREFIX:
                raise InvalidArgument("token", "must look like stk2.<cluster>.<value>.<kid>.<mac>.<scope>")
            _, cluster, value, scope = parts
        if not _VALUE_RE.fullmatch(value):
            raise InvalidArgument("token", "value must be a decimal integer in 1..2**63-1")
        try:  # the fields checked once, by the token's own checks, and reported as the encoded token's
            return cls(cluster=cluster, scope=scope, value=int(value), kid=kid, mac=mac)
        except InvalidArgument as exc:
            raise InvalidArgument("token", exc.reason) from None

    def __str__(self) -> str:
        # Printing, logging and error messages never show the MAC (the write capability).
        return self.unsigned().encode()


# -- epochs: the high bits of a token value ------------------------------------------------------
#
# A coordinator that keeps its counters in a file composes every token value as
# ``epoch << COUNTER_BITS | counter``. The epoch comes from the wall clock when
# the file is opened (and when a scope's counter runs out), and an epoch is only
# used once the wall clock has passed it, so an opener that comes later in real
# time always starts above every epoch used before, even when an older copy of
# the file was brought back in between. docs/coordinator-files.md states the
# assumptions. These functions are pure: the wall clock is passed in.

#: Low bits of a token value: grants per scope within one epoch.
COUNTER_BITS = 22
COUNTER_MAX = (1 << COUNTER_BITS) - 1
#: High bits: the epoch, in ticks since ``EPOCH_BASE_UNIX_S``.
EPOCH_BITS = 41
EPOCH_MAX = (1 << EPOCH_BITS) - 1
#: One epoch tick of the wall clock (1 ms): 2**41 ticks last until the year 2093.
EPOCH_TICK_NS = 1_000_000
#: 2024-01-01T00:00:00Z, the start of epoch tick 0.
EPOCH_BASE_UNIX_S = 1_704_067_200

assert COUNTER_BITS + EPOCH_BITS == 63  # an epoch's last token is at most TOKEN_VALUE_MAX


def epoch_of(value: int) -> int:
    """The epoch a token value belongs to."""
    return value >> COUNTER_BITS


def epoch_floor(epoch: int) -> int:
    """The greatest value below every token of ``epoch`` (its first token is this + 1)."""
    validate_int("epoch", epoch, 0, EPOCH_MAX)
    return epoch << COUNTER_BITS


def epoch_tick(unix_ns: int) -> int:
    """The epoch tick a wall-clock time falls in (0 before the base)."""
    return max(0, (unix_ns - EPOCH_BASE_UNIX_S * 1_000_000_000) // EPOCH_TICK_NS)


def next_epoch(after: int, unix_ns: int) -> int:
    """The epoch an opener starts (or a scope moves on to) at wall time ``unix_ns``.

    Above ``after`` (the greatest epoch the file knows of) and at least the
    current tick. The caller must not hand out a token of it before the wall
    clock has left that tick (`epoch_ready`).

    Raises:
        LimitExceeded: the epoch space is used up (the year 2093).
    """
    epoch = max(after + 1, epoch_tick(unix_ns))
    if epoch > EPOCH_MAX:
        raise LimitExceeded("EPOCH_MAX", EPOCH_MAX, "token epochs are used up")
    return epoch


def epoch_ready(epoch: int, unix_ns: int) -> bool:
    """Whether the wall clock has left ``epoch``'s tick: only then may its tokens be handed out."""
    return epoch_tick(unix_ns) > epoch


def grant_base(last_token: int, floor: int) -> int:
    """What the next token of a scope counts up from: its last token, or the store's floor if higher."""
    return max(last_token, floor)


def counter_exhausted(base: int) -> bool:
    """Whether ``base + 1`` would leave the epoch of ``base`` (a new epoch is needed first)."""
    return (base & COUNTER_MAX) == COUNTER_MAX
