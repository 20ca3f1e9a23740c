"""The values a fenced resource hands back, and the write it is asked to make.

Every adapter (SQLite, in-memory, and those to come) returns these same
frozen types, so a caller never learns which resource answered. They hold no
I/O and are built only after validation (`stockade.core.limits`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

__all__ = ["Op", "Write", "WriteResult", "Item", "AuditRecord", "BackupInfo", "RestoreReport"]

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
class RestoreReport:
    """What a restore did (also written as JSON to ``report_path``).

    Attributes:
        removed: acknowledged writes the old store had and the restored one does
            not (retained audit records with ``commit_seq`` beyond the backup's).
        fence_floors: the floor applied per scope (from the coordinator).
        report_path: where the JSON report was written.
    """

    removed: list[AuditRecord]
    fence_floors: dict[str, int]
    report_path: PurePath


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
