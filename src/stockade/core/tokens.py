"""The fencing token: the product.

A token is ``(cluster, scope, value)``: the coordinator cluster that issued it,
the scope it orders, and an integer in ``1..2**63-1`` that strictly increases
per scope. Its encoded form is what clients carry (``STOCKADE_TOKEN``, the
``Fencing-Token`` header)::

    stk1.<cluster>.<value>.<scope>

``cluster`` is 16 lowercase hex digits and ``value`` is decimal without leading
zeros, so neither contains a dot; the scope comes last because it may.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stockade.core.errors import InvalidArgument
from stockade.core.limits import TOKEN_VALUE_MAX, TOKEN_VALUE_MIN, validate_int, validate_scope

__all__ = ["FencingToken", "validate_cluster_id", "CLUSTER_ID_HEX_DIGITS"]

CLUSTER_ID_HEX_DIGITS = 16
_CLUSTER_RE = re.compile(r"[0-9a-f]{16}")
_VALUE_RE = re.compile(r"[1-9][0-9]{0,18}")
_PREFIX = "stk1"
# prefix + cluster + max value digits + max scope + 3 dots
ENCODED_CHARS_MAX = len(_PREFIX) + 16 + 19 + 200 + 3


def validate_cluster_id(cluster: object, field: str = "cluster") -> str:
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

    def __post_init__(self) -> None:
        validate_cluster_id(self.cluster)
        validate_scope(self.scope)
        validate_int("token", self.value, TOKEN_VALUE_MIN, TOKEN_VALUE_MAX)

    def encode(self) -> str:
        """The string form clients pass around; `decode` round-trips it."""
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
        parts = text.split(".", 3)
        if len(parts) != 4 or parts[0] != _PREFIX:
            raise InvalidArgument("token", "must look like stk1.<cluster>.<value>.<scope>")
        _, cluster, value, scope = parts
        if not _VALUE_RE.fullmatch(value):
            raise InvalidArgument("token", "value must be a decimal integer in 1..2**63-1")
        return cls(cluster=validate_cluster_id(cluster, "token"), scope=validate_scope(scope, "token"), value=int(value))

    def __str__(self) -> str:
        return self.encode()
