"""The exceptions stockade raises: one tree for operating errors, one class for bugs.

Blame is in the name: a caller's mistake (`InvalidArgument`), a client that
has been fenced out (`StaleToken`, `TokenMismatch`), a lease the caller no
longer holds (`NotHolder`, `LeaseLost`), a wait that ran out (`LockTimeout`),
a bound that was reached (`LimitExceeded`), or a backend that failed
(`BackendUnavailable`). All of these derive from `StockadeError`, and a caller
may handle them.

A broken invariant is a bug in stockade, not an operating error: `invariant()`
raises `InvariantViolation`, which derives from `AssertionError` and *not*
from `StockadeError`. So ``except StockadeError`` never swallows a bug: a
batch is not committed around one, a keepalive does not retry one, and an
application's error handler does not mistake one for a refused write.

Every class has a stable ``code`` (used as the problem type over HTTP) and
every instance carries structured fields, so callers never parse messages.

    StockadeError                operating errors: handle them
    ├── InvalidArgument          caller passed a bad value (nothing changed)
    ├── LimitExceeded            a named bound was reached (nothing changed)
    ├── FenceRejected            the resource refused a write (nothing changed)
    │   ├── StaleToken           token < high-water mark
    │   └── TokenMismatch        token for another scope or cluster
    ├── AlreadyApplied           the operation id was applied before (R3; nothing applied now)
    ├── LeaseError
    │   ├── NotHolder            lease id is not the current holder (gone/unknown)
    │   ├── LeaseLost            the client gave the lease up as lost (K2)
    │   └── LockTimeout          the wait deadline passed before a grant
    ├── Unauthorized             the server refused the credentials (nothing changed)
    └── BackendUnavailable       I/O failed or timed out; outcome may be unknown
        ├── WrongFileKind        the file is not what it was opened as (nothing touched)
        └── ClockMismatch        the file's times are on another monotonic clock

    AssertionError
    └── InvariantViolation       a bug in stockade: let it propagate, report it
"""

from __future__ import annotations

__all__ = [
    "StockadeError",
    "InvalidArgument",
    "LimitExceeded",
    "FenceRejected",
    "StaleToken",
    "Superseded",
    "TokenMismatch",
    "AlreadyApplied",
    "LeaseError",
    "NotHolder",
    "LeaseLost",
    "LockTimeout",
    "Unauthorized",
    "BackendUnavailable",
    "WrongFileKind",
    "ClockMismatch",
    "InvariantViolation",
    "invariant",
]


class StockadeError(Exception):
    """Root of every error stockade raises on purpose."""

    code = "stockade-error"


class InvalidArgument(StockadeError, ValueError):
    """The caller passed a value outside its documented domain.

    Attributes:
        field: the argument or field name.
        reason: what is wrong with it, in words.
    """

    code = "invalid-argument"

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class LimitExceeded(StockadeError):
    """A named limit was reached (waiters per scope, leases, token space).

    Attributes:
        limit: the limit's name in `stockade.core.limits`.
        value: the limit's value.
    """

    code = "limit-exceeded"

    def __init__(self, limit: str, value: int, detail: str = "") -> None:
        self.limit = limit
        self.value = value
        super().__init__(f"{limit}={value} reached" + (f": {detail}" if detail else ""))


class FenceRejected(StockadeError):
    """A resource refused a write because of its fencing token. Nothing changed.

    Never retry the same write with the same token (rule K3): re-acquire,
    read, reconcile.
    """

    code = "fence-rejected"
    reason = "rejected"


class StaleToken(FenceRejected):
    """The token is lower than the highest the resource has accepted (R1).

    Attributes:
        token: the rejected token (a `FencingToken`).
        high_water: the resource's high-water mark for the scope (an int).
    """

    code = "stale-token"
    reason = "stale"

    def __init__(self, token: object, high_water: int) -> None:
        self.token = token
        self.high_water = high_water
        value = getattr(token, "value", token)
        super().__init__(f"token {value} < high-water mark {high_water}")


class Superseded(StaleToken):
    """A newer token for the scope ended this transaction's session before it committed (nothing applied).

    The PostgreSQL fence ends the session of a transaction that holds a scope
    with a lower token once a newer token has waited for it longer than its
    bound (docs/fence-postgres.md, "A paused writer"); the paused writer's next
    statement or commit then fails with this error. Nothing of the transaction
    was applied: an ended session never commits.

    Attributes:
        token: the token of the ended transaction.
        high_water: 0, not known to the ended session (the newer token is above ``token``).
    """

    code = "superseded"

    def __init__(self, token: object, detail: str = "") -> None:
        super().__init__(token, 0)
        value = getattr(token, "value", token)
        self.args = (f"token {value} was superseded: a newer token ended this transaction's session before it "
                     f"committed (not applied){': ' + detail if detail else ''}",)


class TokenMismatch(FenceRejected):
    """The token was issued for another scope or another coordinator cluster (R2), or not by it at all.

    Attributes:
        token: the rejected token.
        reason: ``"wrong-scope"``, ``"wrong-cluster"``, or ``"forged (DETAIL)"``:
            the resource's keys did not verify it. ``"forged (unsigned)"`` is
            most often ``str(token)`` (the display form, without the MAC) passed
            as the token; the message says to pass ``token.encode()``.
        expected: the scope or cluster the resource expected.
    """

    code = "token-mismatch"

    def __init__(self, token: object, reason: str, expected: str) -> None:
        self.token = token
        self.reason = reason
        self.expected = expected
        message = f"{reason}: token {token} does not belong to {expected!r}"
        if reason == "forged (unsigned)":
            # The usual cause: ``str(token)`` (the display form, MAC left out on purpose) passed as the token.
            message += ("; it carries no MAC: str(token) is only the token's display form, so write with the token "
                        "itself or token.encode() (what $STOCKADE_TOKEN and the Fencing-Token header hold)")
        super().__init__(message)


class AlreadyApplied(StockadeError):
    """A transaction carried an operation id that a committed transaction applied before (R3).

    Nothing of this attempt was applied: the retry of an operation whose
    outcome was unknown (a lost connection, a killed writer) learns that its
    original committed. Raised even when the token has gone stale since, and
    never for a token that is forged or of another scope.

    Attributes:
        scope: the operation's scope.
        op_id: the operation id.
        token_value: the value of the token the operation was applied with.
    """

    code = "already-applied"

    def __init__(self, scope: str, op_id: str, token_value: int) -> None:
        self.scope = scope
        self.op_id = op_id
        self.token_value = token_value
        super().__init__(f"operation {op_id!r} of scope {scope!r} was applied already, under token {token_value}")


class LeaseError(StockadeError):
    """Base for errors about holding a lease."""

    code = "lease-error"


class NotHolder(LeaseError):
    """The lease id names no current lease: released, expired, or never granted.

    Attributes:
        lease_hint: a short, non-secret prefix of the lease id (for logs).
    """

    code = "not-holder"

    def __init__(self, lease_hint: str, detail: str = "lease is not held") -> None:
        self.lease_hint = lease_hint
        super().__init__(f"lease {lease_hint}…: {detail}")


class LeaseLost(LeaseError):
    """The client marked its lease lost (renewal failed or its local deadline passed).

    Attributes:
        scope: the scope of the lost lease.
        token: its fencing token.
        cause: why it was marked lost.
    """

    code = "lease-lost"

    def __init__(self, scope: str, token: object, cause: str) -> None:
        self.scope = scope
        self.token = token
        self.cause = cause
        super().__init__(f"lease on {scope!r} lost: {cause}")


class LockTimeout(LeaseError):
    """The wait deadline passed while the scope was still held or queued.

    Attributes:
        scope: the scope that was asked for.
        wait_ms: how long the caller was prepared to wait (for a server's answer to an acquire
            that waits until granted: the server's per-request cap).
        ticket: None, or the queue ticket a server gives an acquire that waits until granted
            when its per-request cap ran out: sent back, it continues that wait at the same
            place in the queue (docs/leases.md, "Waiting until granted"). A client never
            sees it raised: its wait continues.
    """

    code = "lock-timeout"

    def __init__(self, scope: str, wait_ms: int, *, ticket: str | None = None) -> None:
        self.scope = scope
        self.wait_ms = wait_ms
        self.ticket = ticket
        super().__init__(f"scope {scope!r} still held after waiting {wait_ms} ms")


class Unauthorized(StockadeError):
    """The server refused the request's credentials (HTTP 401). Nothing changed.

    The server says nothing about why, so neither does this error: check the
    bearer token given as ``auth_token`` (or ``$STOCKADE_AUTH_TOKEN``).
    """

    code = "unauthorized"


class BackendUnavailable(StockadeError):
    """The coordinator or resource could not be reached or failed.

    The outcome of the operation is unknown unless ``certain_no_effect`` is true.
    """

    code = "backend-unavailable"

    def __init__(self, detail: str, *, certain_no_effect: bool = False) -> None:
        self.detail = detail
        self.certain_no_effect = certain_no_effect
        super().__init__(detail)


class WrongFileKind(BackendUnavailable):
    """The path is not a file of the kind it was opened as; it was refused untouched.

    Raised before anything is written: no table added, no lock file left, the
    file's bytes and times unchanged.

    Attributes:
        path: the path that was refused.
        expected: what it was opened as (e.g. ``"coordinator"``).
        found: what it is (e.g. ``"stockade store"``, ``"directory"``).
    """

    code = "wrong-file-kind"

    def __init__(self, path: str, expected: str, found: str) -> None:
        self.path = path
        self.expected = expected
        self.found = found
        super().__init__(f"{path} is {found}, not a stockade {expected} file; refused, nothing was changed",
                         certain_no_effect=True)


class ClockMismatch(BackendUnavailable):
    """The file's lease times are on a monotonic clock this process does not share.

    Processes in different time namespaces (``unshare --time``) see different
    monotonic clocks on one boot; their lease deadlines cannot be compared.

    Attributes:
        path: the file.
        detail: what disagrees, in words.
    """

    code = "clock-mismatch"

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"{path}: {detail}", certain_no_effect=True)


class InvariantViolation(AssertionError):
    """An internal invariant broke: a bug in stockade. Please report it.

    Deliberately outside the `StockadeError` tree, so that code which handles
    operating errors (retries, per-write error slots, ``except StockadeError``)
    lets a bug through instead of carrying on around it.
    """

    code = "invariant-violation"


def invariant(condition: object, message: str) -> None:
    """Raise `InvariantViolation` unless ``condition`` holds.

    Unlike ``assert``, this is not stripped by ``python -O``: a coordinator
    that has lost track of its own state must stop, not carry on.
    """
    if not condition:
        raise InvariantViolation(message)
