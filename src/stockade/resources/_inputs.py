"""Argument checks every adapter makes the same way, before it touches its resource.

Bad input raises `InvalidArgument` here, so no adapter can change state for it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from stockade.core.errors import InvalidArgument
from stockade.core.limits import (
    AUDIT_RECORDS_MAX,
    IDEMPOTENCY_KEYS_MAX,
    LIST_PAGE_MAX,
    TOKEN_VALUE_MAX,
    VALUE_BYTES_CEILING,
    validate_idempotency_key,
    validate_int,
    validate_key,
    validate_scope,
    validate_value,
)
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors, Op, Write

__all__ = [
    "coerce_token", "make_write", "check_page", "check_audit_page", "check_floors", "check_bounds",
    "BUSY_TIMEOUT_MS_DEFAULT", "BUSY_TIMEOUT_MS_MAX",
]

BUSY_TIMEOUT_MS_DEFAULT = 5_000  # how long a store operation waits for the store's lock, by default
BUSY_TIMEOUT_MS_MAX = 60_000


def check_bounds(
    value_bytes_max: object, busy_timeout_ms: object, audit_records_max: object, idempotency_keys_max: object
) -> tuple[int, int, int, int]:
    """The bounds every store adapter is opened with, checked alike; returned in the same order.

    Raises:
        InvalidArgument: one is not an integer in its range.
    """
    return (
        validate_int("value_bytes_max", value_bytes_max, 0, VALUE_BYTES_CEILING),
        validate_int("busy_timeout_ms", busy_timeout_ms, 0, BUSY_TIMEOUT_MS_MAX),
        validate_int("audit_records_max", audit_records_max, 1, AUDIT_RECORDS_MAX),
        validate_int("idempotency_keys_max", idempotency_keys_max, 1, IDEMPOTENCY_KEYS_MAX),
    )


@functools.lru_cache(maxsize=256)
def _decoded(text: str) -> FencingToken:
    """`FencingToken.decode`, remembered: a pure function of the string (a malformed one raises, never kept)."""
    return FencingToken.decode(text)


def coerce_token(token: object) -> FencingToken:
    """Accept a `FencingToken` or its encoded string (K1: never an int, a float or a bool).

    Raises:
        InvalidArgument: anything else, or a malformed string.
    """
    if isinstance(token, FencingToken):
        # Rebuild it: the constructor validates, so a token forged past it (object.__setattr__,
        # a subclass) is caught here rather than compared.
        return FencingToken(
            token.cluster, token.scope, token.value, getattr(token, "kid", ""), getattr(token, "mac", "")
        )
    if type(token) is str:
        return _decoded(token)
    if isinstance(token, str):
        return FencingToken.decode(token)
    raise InvalidArgument("token", f"must be a FencingToken or its encoded string, got {type(token).__name__}")


def make_write(
    scope: object, key: object, op: Op, value: object, idempotency_key: object, *, value_bytes_max: int
) -> Write:
    """A validated `Write` (a delete's value is ignored and stored as ``b""``).

    Raises:
        InvalidArgument: a bad scope, key, value or idempotency key.
    """
    return Write(
        validate_scope(scope), validate_key(key), op,
        b"" if op == "delete" else validate_value(value, value_bytes_max),
        None if idempotency_key is None else validate_idempotency_key(idempotency_key),
    )


def check_page(scope: object, after: object, limit: object) -> tuple[str, str, int]:
    """Validate the arguments of a ``list`` page: ``after`` is ``""`` or a key, ``limit`` 1..LIST_PAGE_MAX."""
    scope = validate_scope(scope)
    if after != "":
        after = validate_key(after)
    return scope, str(after), validate_int("limit", limit, 1, LIST_PAGE_MAX)


def check_audit_page(scope: object, after_seq: object, limit: object) -> tuple[str | None, int, int]:
    """Validate the arguments of an ``audit`` page."""
    return (
        None if scope is None else validate_scope(scope),
        validate_int("after_seq", after_seq, 0, TOKEN_VALUE_MAX),
        validate_int("limit", limit, 1, LIST_PAGE_MAX),
    )


def check_floors_and_default(floors: object, default: object = 0) -> tuple[dict[str, int], int]:
    """Validate fence floors and the default floor of every scope not named (R4).

    ``floors`` may be a `FenceFloors` (its own default counts too) or a mapping
    of scope to a token value in 0..2**63-1.
    """
    checked_default = validate_int("default", default, 0, TOKEN_VALUE_MAX)
    if isinstance(floors, FenceFloors):
        return dict(floors.floors), max(checked_default, floors.default)
    return check_floors(floors), checked_default


def check_floors(floors: object) -> dict[str, int]:
    """Validate fence floors: a mapping of scope to a token value in 0..2**63-1."""
    if not isinstance(floors, Mapping):
        raise InvalidArgument("floors", "must be a mapping of scope to token value")
    return {
        validate_scope(scope, "floors"): validate_int(f"floors[{scope}]", value, 0, TOKEN_VALUE_MAX)
        for scope, value in floors.items()
    }
