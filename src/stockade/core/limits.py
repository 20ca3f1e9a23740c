"""Every bound in stockade, named once, with the validators that enforce them.

A value outside its bound raises `InvalidArgument` naming the field and the
bound, and changes nothing. These are the limits of the contract, the ones a
caller meets whatever the transport. Limits of one transport or tool (HTTP
header sizes, connections, batch sizes) are named at the top of the module
that enforces them, each ending in ``_MAX``. Durations are integers in the unit their name ends
with; `bool` is never accepted as an integer.
"""

from __future__ import annotations

import re

from stockade.core.errors import InvalidArgument

__all__ = [
    "TTL_MS_MIN",
    "TTL_MS_MAX",
    "WAIT_MS_MIN",
    "WAIT_MS_MAX",
    "WAIT_FOREVER_DEADLINE_NS",
    "LOCK_DELAY_MS_MAX",
    "RELEASE_LAG_MS",
    "RELEASE_LAG_MS_MAX",
    "SCOPE_BYTES_MAX",
    "SCOPE_CHARS",
    "KEY_BYTES_MAX",
    "VALUE_BYTES_MAX",
    "HOLDER_BYTES_MAX",
    "IDEMPOTENCY_KEY_BYTES_MAX",
    "TOKEN_VALUE_MIN",
    "TOKEN_VALUE_MAX",
    "WAITERS_PER_SCOPE_MAX",
    "CONTENDERS_MAX",
    "LEASES_MAX",
    "LIST_PAGE_MAX",
    "VALUE_BYTES_CEILING",
    "AUDIT_RECORDS_MAX",
    "IDEMPOTENCY_KEYS_MAX",
    "STORE_SCOPES_MAX",
    "TX_WRITES_MAX",
    "OP_ID_BYTES_MAX",
    "OPERATION_IDS_MAX",
    "SUPERSEDE_AFTER_MS",
    "SUPERSEDE_AFTER_MS_MIN",
    "SUPERSEDE_AFTER_MS_MAX",
    "validate_int",
    "validate_ttl_ms",
    "validate_wait_ms",
    "validate_wait",
    "wait_deadline_ns",
    "validate_scope",
    "validate_key",
    "validate_value",
    "validate_holder",
    "validate_idempotency_key",
    "validate_op_id",
]

TTL_MS_MIN = 100
TTL_MS_MAX = 3_600_000
WAIT_MS_MIN = 0
WAIT_MS_MAX = 300_000
#: The wait deadline of an acquire that waits until granted (``wait_ms=None``), on any clock in
#: nanoseconds: 2**62 ns is 146 years past the clock's zero, and adding a TTL to it stays a
#: signed 64-bit integer (the SQL copies of the rules keep deadlines in ``bigint``).
WAIT_FOREVER_DEADLINE_NS = 2**62
LOCK_DELAY_MS_MAX = 60_000
#: `stockade serve` answers a release before its commit and commits it at most this long after (with the next
#: grant or renewal, if one comes sooner): long enough for a client's next request after a release (a few hundred
#: µs on an idle host, a few ms on a busy one), short enough that an idle server makes a release durable soon.
#: What a crash in between does: docs/rules.md, C3. 0 (``--release-lag-ms 0``): a release waits for its commit.
RELEASE_LAG_MS = 10
RELEASE_LAG_MS_MAX = 60_000

SCOPE_BYTES_MAX = 200
#: The characters of a scope, as the body of a regex character class. The one spelling: the core's check
#: (`validate_scope`), the HTTP API's pattern (OpenAPI), auth's scope patterns and the PostgreSQL fence's
#: SQL check are each built from it. A token's characters are among them too (its scope is its tail).
SCOPE_CHARS = "A-Za-z0-9._:-"
KEY_BYTES_MAX = 1024
VALUE_BYTES_MAX = 1024 * 1024
HOLDER_BYTES_MAX = 200
IDEMPOTENCY_KEY_BYTES_MAX = 200

TOKEN_VALUE_MIN = 1
TOKEN_VALUE_MAX = 2**63 - 1

WAITERS_PER_SCOPE_MAX = 1024
#: The most contenders one ``contenders`` call lists: a holder and a full queue of waiters.
CONTENDERS_MAX = WAITERS_PER_SCOPE_MAX + 1
LEASES_MAX = 100_000
LIST_PAGE_MAX = 1000

# The fenced store (stockade.resources.store documents what happens at each bound).
VALUE_BYTES_CEILING = 16 * 1024 * 1024  # the most a store's value_bytes_max may be raised to
AUDIT_RECORDS_MAX = 100_000  # newest accepted writes kept in the audit trail
IDEMPOTENCY_KEYS_MAX = 100_000  # idempotency keys remembered per store
STORE_SCOPES_MAX = 100_000  # scopes (high-water marks) per store
TX_WRITES_MAX = 10_000  # writes in one multi-step transaction

# Operation ids of the fences over a user's own database (PostgreSQL, SQLite): R3 for a transaction.
OP_ID_BYTES_MAX = 200
# Operation ids remembered per database: each new one past the bound forgets the oldest, so a
# retry is recognised while fewer than this many newer ids were recorded after its original.
OPERATION_IDS_MAX = 100_000
#: How long a newer token waits, at the PostgreSQL fence, for a transaction that holds its scope
#: with a lower token before that transaction's session is ended (the default of `install`).
SUPERSEDE_AFTER_MS = 2_000
SUPERSEDE_AFTER_MS_MIN = 10
SUPERSEDE_AFTER_MS_MAX = 600_000

_SCOPE_RE = re.compile(f"[{SCOPE_CHARS}]{{1,{SCOPE_BYTES_MAX}}}")
# Printable ASCII without space: safe in headers, logs and file names of reports.
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+")
_HOLDER_RE = re.compile(f"[\\x21-\\x7e]{{1,{HOLDER_BYTES_MAX}}}")  # `validate_holder`'s whole rule, for a str


def validate_int(field: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not bool) in ``low..high``, else raise."""
    if type(value) is int and low <= value <= high:  # the usual case, without a call (bool's type is bool)
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be in {low}..{high}, got {value}")
    return value


def validate_ttl_ms(ttl_ms: object) -> int:
    if type(ttl_ms) is int and TTL_MS_MIN <= ttl_ms <= TTL_MS_MAX:
        return ttl_ms  # the usual case, as `validate_int` takes it, without the call
    return validate_int("ttl_ms", ttl_ms, TTL_MS_MIN, TTL_MS_MAX)


def validate_wait_ms(wait_ms: object) -> int:
    return validate_int("wait_ms", wait_ms, WAIT_MS_MIN, WAIT_MS_MAX)


def validate_wait(wait_ms: object) -> int | None:
    """A client's wait: ``None`` (until granted, or until the caller cancels) or ``0..WAIT_MS_MAX``.

    No string stands for "forever" (``"forever"`` is the CLI's spelling, turned into ``None`` there).
    """
    if type(wait_ms) is int and WAIT_MS_MIN <= wait_ms <= WAIT_MS_MAX:
        return wait_ms  # the usual case, as `validate_int` takes it, without the calls
    return None if wait_ms is None else validate_wait_ms(wait_ms)


def wait_deadline_ns(now_ns: int, wait_ms: int | None) -> int:
    """The deadline of a wait of ``wait_ms`` from ``now_ns``; `WAIT_FOREVER_DEADLINE_NS` for ``None``."""
    return WAIT_FOREVER_DEADLINE_NS if wait_ms is None else now_ns + wait_ms * 1_000_000


def validate_scope(scope: object, field: str = "scope") -> str:
    """A scope is 1..200 characters of ``[A-Za-z0-9._:-]``, and not ``.`` or ``..``.

    ``.`` and ``..`` are refused because a proxy normalises them out of a URL
    path (``/v1/locks/../acquire``) and a file adapter must never resolve them.
    """
    if type(scope) is str and _SCOPE_RE.fullmatch(scope) and scope != "." and scope != "..":
        return scope  # the usual case: one match
    if not isinstance(scope, str):
        raise InvalidArgument(field, f"must be a string, got {type(scope).__name__}")
    if scope in (".", ".."):
        raise InvalidArgument(field, f"must not be {scope!r} (a path step, not a name)")
    if not _SCOPE_RE.fullmatch(scope):
        if not 1 <= len(scope) <= SCOPE_BYTES_MAX:
            raise InvalidArgument(field, f"must be 1..{SCOPE_BYTES_MAX} bytes, got {len(scope)}")
        raise InvalidArgument(field, "may contain only A-Z a-z 0-9 . _ : -")
    return scope


def _validate_text(field: str, value: object, bytes_max: int) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= bytes_max:
        raise InvalidArgument(field, f"must be 1..{bytes_max} bytes, got {size}")
    return value


def validate_key(key: object) -> str:
    """A store key: any non-empty UTF-8 string up to 1 KiB, without NUL."""
    key = _validate_text("key", key, KEY_BYTES_MAX)
    if "\x00" in key:
        raise InvalidArgument("key", "must not contain NUL")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("key", "must be valid UTF-8 (no lone surrogates)") from None
    return key


def validate_value(value: object, value_bytes_max: int = VALUE_BYTES_MAX) -> bytes:
    """A store value: bytes (or str, stored as UTF-8) up to ``value_bytes_max``."""
    if isinstance(value, str):
        try:
            value = value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument("value", "must be valid UTF-8 (no lone surrogates)") from None
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise InvalidArgument("value", f"must be bytes or str, got {type(value).__name__}")
    if len(value) > value_bytes_max:
        raise InvalidArgument("value", f"must be at most {value_bytes_max} bytes, got {len(value)}")
    return value


def validate_holder(holder: object) -> str:
    """A holder name: printable ASCII without spaces, 1..200 bytes (shown in status)."""
    if type(holder) is str and _HOLDER_RE.fullmatch(holder):
        return holder  # the usual case: one match (ASCII: a character is a byte)
    holder = _validate_text("holder", holder, HOLDER_BYTES_MAX)
    if not _PRINTABLE_RE.fullmatch(holder):
        raise InvalidArgument("holder", "must be printable ASCII without spaces")
    return holder


def validate_idempotency_key(key: object) -> str:
    key = _validate_text("idempotency_key", key, IDEMPOTENCY_KEY_BYTES_MAX)
    if not _PRINTABLE_RE.fullmatch(key):
        raise InvalidArgument("idempotency_key", "must be printable ASCII without spaces")
    return key


def validate_op_id(op_id: object) -> str:
    """An operation id: printable ASCII without spaces, 1..200 bytes (like an idempotency key)."""
    op_id = _validate_text("op_id", op_id, OP_ID_BYTES_MAX)
    if not _PRINTABLE_RE.fullmatch(op_id):
        raise InvalidArgument("op_id", "must be printable ASCII without spaces")
    return op_id
