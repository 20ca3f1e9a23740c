"""What every fenced shard log shares: its values, its bounds and its argument checks.

The backends (`stockade.recipes.log.SQLiteShardLog`, `stockade.recipes._log_postgres.PostgresShardLog`)
validate every argument here, before they touch their store, so bad input
raises `InvalidArgument` or `LimitExceeded` and changes nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stockade.core.errors import InvalidArgument, LimitExceeded
from stockade.core.fence import Recorded
from stockade.core.limits import TOKEN_VALUE_MAX, VALUE_BYTES_MAX, validate_idempotency_key, validate_int
from stockade.core.values import WriteResult

__all__ = [
    "LogEntry", "AppendResult", "OffsetConflict", "ENTRY_BYTES_MAX", "ENTRY_BYTES_CEILING", "BATCH_ENTRIES_MAX",
    "BATCH_BYTES_MAX", "READ_LIMIT_MAX", "READ_WAIT_MS_MAX", "check_batch", "check_read", "fingerprint",
    "recorded", "wait_for_entries",
]

#: The largest entry a log accepts by default, and the most a log may be opened with.
ENTRY_BYTES_MAX = 64 * 1024
ENTRY_BYTES_CEILING = VALUE_BYTES_MAX
#: Entries in one `append_batch`, and their bytes together.
BATCH_ENTRIES_MAX = 1_000
BATCH_BYTES_MAX = 8 * 1024 * 1024
#: Entries one `read` returns at most, and the longest a read waits for a new entry.
READ_LIMIT_MAX = 1_000
READ_WAIT_MS_MAX = 60_000
_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of a shard's log.

    Attributes:
        shard: the shard (a scope: its writer's token is of this scope).
        offset: the entry's position, 0, 1, 2, ... with no gap.
        token_value: the token the writer carried.
        data: the entry's bytes.
    """

    shard: str
    offset: int
    token_value: int
    data: bytes


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The acknowledgement of an append: its entries are durable at ``first_offset .. first_offset+count-1``.

    Attributes:
        replayed: the idempotency key was already appended (by an earlier try whose
            answer was lost); these are that append's offsets, and nothing was appended now.
        high_water: the shard's high-water mark after the append.
    """

    shard: str
    first_offset: int
    count: int
    token_value: int
    high_water: int
    replayed: bool = False

    @property
    def next_offset(self) -> int:
        """The offset the shard's next entry gets (as of this append)."""
        return self.first_offset + self.count


class OffsetConflict(InvalidArgument):
    """An append's ``expected_offset`` is not the shard's next offset. Nothing was appended.

    Attributes:
        next_offset: the shard's next offset when the append was judged.
    """

    code = "offset-conflict"

    def __init__(self, shard: str, expected: int, next_offset: int) -> None:
        self.next_offset = next_offset
        super().__init__("expected_offset", f"shard {shard!r} is at offset {next_offset}, not {expected}")


def check_batch(
    entries: object, idempotency_key: object, expected_offset: object, *, entry_bytes_max: int
) -> tuple[list[bytes], str | None, int | None]:
    """Validate an append's entries, idempotency key and expected offset.

    Raises:
        InvalidArgument: not a sequence of bytes, an empty batch, a bad key or offset.
        LimitExceeded: an entry above ``entry_bytes_max``, a batch above `BATCH_ENTRIES_MAX`
            entries or `BATCH_BYTES_MAX` bytes.
    """
    if isinstance(entries, bytes | bytearray | str) or not isinstance(entries, Sequence):
        raise InvalidArgument("entries", "must be a sequence of bytes")
    if not entries:
        raise InvalidArgument("entries", "an append needs at least one entry")
    if len(entries) > BATCH_ENTRIES_MAX:
        raise LimitExceeded("BATCH_ENTRIES_MAX", BATCH_ENTRIES_MAX, f"an append of {len(entries)} entries")
    checked: list[bytes] = []
    total = 0
    for index, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = entry.encode()
        if not isinstance(entry, bytes | bytearray):
            raise InvalidArgument(f"entries[{index}]", f"must be bytes or str, got {type(entry).__name__}")
        if len(entry) > entry_bytes_max:
            raise LimitExceeded("ENTRY_BYTES_MAX", entry_bytes_max, f"entry {index} is {len(entry)} bytes")
        total += len(entry)
        checked.append(bytes(entry))
    if total > BATCH_BYTES_MAX:
        raise LimitExceeded("BATCH_BYTES_MAX", BATCH_BYTES_MAX, f"an append of {total} bytes")
    key = None if idempotency_key is None else validate_idempotency_key(idempotency_key)
    expected = None if expected_offset is None else validate_int("expected_offset", expected_offset, 0,
                                                                 TOKEN_VALUE_MAX)
    return checked, key, expected


def check_read(from_offset: object, limit: object, wait_ms: object) -> tuple[int, int, int]:
    """Validate a read's offset (0..2**63-1), limit (1..`READ_LIMIT_MAX`) and wait (0..`READ_WAIT_MS_MAX`)."""
    return (validate_int("from_offset", from_offset, 0, TOKEN_VALUE_MAX),
            validate_int("limit", limit, 1, READ_LIMIT_MAX),
            validate_int("wait_ms", wait_ms, 0, READ_WAIT_MS_MAX))


def fingerprint(entries: Sequence[bytes]) -> str:
    """What an idempotency key is bound to: the entries' count, lengths and bytes."""
    digest = hashlib.sha256(len(entries).to_bytes(8, "big"))
    for entry in entries:
        digest.update(len(entry).to_bytes(8, "big"))
        digest.update(entry)
    return digest.hexdigest()[:32]


def recorded(shard: str, key: str, first_offset: int, token_value: int, high_water: int,
             print_: str) -> Recorded:
    """An earlier append under ``key`` as the fence's `Recorded` (its first offset as ``commit_seq``)."""
    return Recorded(print_, WriteResult(shard, key, token_value, high_water, first_offset, replayed=True))


def wait_for_entries(read_once: Callable[[], list[LogEntry]], wait_ms: int,
                     wait_signal: Callable[[float], None] | None = None) -> list[LogEntry]:
    """Read until something is there or ``wait_ms`` passed (polling with a capped backoff, or ``wait_signal``)."""
    deadline = time.monotonic() + wait_ms / 1000
    pause = _POLL_FIRST_S
    while True:
        found = read_once()
        left = deadline - time.monotonic()
        if found or left <= 0:
            return found
        if wait_signal is not None:
            wait_signal(min(left, _POLL_MAX_S * 20))
        else:
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)
