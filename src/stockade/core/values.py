"""The values a fenced resource hands back, and the write it is asked to make.

Every adapter (SQLite, in-memory, and those to come) returns these same
frozen types, so a caller never learns which resource answered. They hold no
I/O and are built only after validation (`stockade.core.limits`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import Literal

from stockade.core.errors import InvalidArgument
from stockade.core.limits import TOKEN_VALUE_MAX, validate_int, validate_scope
from stockade.core.tokens import FencingToken

__all__ = ["Op", "Write", "WriteResult", "Item", "AuditRecord", "BackupInfo", "RestoreReport", "FenceFloors", "Grant"]

Op = Literal["put", "delete"]


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The acknowledgement of an accepted write.

    Attributes:
        scope, key: what was written.
        token_value: the token the write carried.
        high_water: the scope's HWM right after the write (equals ``token_value``).
        commit_seq: the write's position in the store's order of accepted writes.
        replayed: true when an idempotency key matched an earlier write and this
            is that write's original result (nothing was applied now).
    """

    scope: str
    key: str
    token_value: int
    high_water: int
    commit_seq: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Item:
    """A stored value and the write that put it there."""

    scope: str
    key: str
    value: bytes
    token_value: int
    commit_seq: int


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One accepted write, as kept in the audit trail (the checkers' white-box oracle)."""

    commit_seq: int
    scope: str
    key: str
    op: Op
    token_value: int
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What a backup holds: its last ``commit_seq`` and every scope's HWM."""

    path: PurePath
    commit_seq: int
    high_waters: dict[str, int]


@dataclass(frozen=True, slots=True)
class FenceFloors:
    """A fence floor for *every* scope, as a restore needs it (R4).

    ``floors`` names scopes with a floor of their own (the coordinator's last
    issued token for each); ``default`` is the floor of every scope not named,
    including scopes nobody has heard of yet. A coordinator that forgets idle
    scopes sets ``default`` above every token it ever issued for them, so a
    value is complete by construction: no scope is left without a floor.

    Attributes:
        floors: scope -> token value in 0..2**63-1 (read-only once built).
        default: the floor of every scope not in ``floors`` (0..2**63-1).

    Raises:
        InvalidArgument: a bad scope, floor or default.
    """

    floors: Mapping[str, int]
    default: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.floors, Mapping):
            raise InvalidArgument("floors", "must be a mapping of scope to token value")
        checked = {
            validate_scope(scope, "floors"): validate_int(f"floors[{scope}]", value, 0, TOKEN_VALUE_MAX)
            for scope, value in self.floors.items()
        }
        object.__setattr__(self, "floors", MappingProxyType(dict(sorted(checked.items()))))
        validate_int("default", self.default, 0, TOKEN_VALUE_MAX)

    def floor(self, scope: str) -> int:
        """The floor of ``scope``: its own if named, else ``default``."""
        return self.floors.get(scope, self.default)


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore did (also written as JSON to ``report_path``).

    Attributes:
        removed: acknowledged writes the old store had and the restored one does
            not (retained audit records with ``commit_seq`` beyond the backup's).
        fence_floors: the floor applied per scope the restore knew of (from the coordinator).
        report_path: where the JSON report was written.
        raised: every scope whose mark the restore set above the backup's,
            as ``scope -> (backup's mark, mark after)``.
        default_floor: the floor kept for every scope without a mark of its own.
        old_store: ``"present"``, ``"missing"`` or ``"unreadable"``.
    """

    removed: list[AuditRecord]
    fence_floors: dict[str, int]
    report_path: PurePath
    raised: dict[str, tuple[int, int]] = field(default_factory=dict)
    default_floor: int = 0
    old_store: str = "missing"


@dataclass(frozen=True, slots=True)
class Write:
    """One validated write, before the fence has judged it.

    Build it only from validated parts (the adapters do, with
    `stockade.core.limits`); a delete carries ``value=b""``.
    """

    scope: str
    key: str
    op: Op
    value: bytes
    idempotency_key: str | None

    def fingerprint(self) -> str:
        """What an idempotency key promises to repeat: the operation, not the token.

        A retry after re-acquiring carries a newer token and must still replay,
        so the token is left out.
        """
        digest = hashlib.sha256(self.op.encode() + b"\0" + self.key.encode() + b"\0" + self.value)
        return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Grant:
    """What a coordinator port answers to a granted acquire, as the client sees it.

    Not the coordinator's `stockade.core.leases.Lease`: the client never sees
    the coordinator's clock (C3), only its own. Its lease deadline counts from
    ``sent_ns``, the send time of the attempt that was granted (K2).

    Attributes:
        lease_id: the lease's secret id (renew and release name it).
        holder: the holder name the coordinator shows.
        token: the fencing token of the grant.
        ttl_ms: the lease's time to live.
        sent_ns: the client's monotonic clock when the granted attempt was sent.
    """

    lease_id: str
    holder: str
    token: FencingToken
    ttl_ms: int
    sent_ns: int
