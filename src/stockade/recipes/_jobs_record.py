"""The record a fenced job leaves in its store, how a result is serialised, and `JobUncertain`.

Pure: no I/O. `stockade.recipes.jobs` reads and writes these records through a
fenced store, under the job's lease.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from stockade.core.errors import InvalidArgument, LimitExceeded, StockadeError
from stockade.core.limits import SCOPE_BYTES_MAX, SCOPE_CHARS, VALUE_BYTES_MAX, validate_int, validate_scope

__all__ = [
    "JOB_SCOPE_PREFIX", "RECORD_KEY", "FENCE_KEY", "RESULT_BYTES_MAX_DEFAULT", "RESULT_BYTES_CEILING",
    "ERROR_CHARS_MAX",
    "JobRecord", "JobUncertain", "JsonCodec", "job_scope", "decode_record", "encode_record", "encode_result",
]

#: Every job's scope is this prefix and the job key: one lease, one token sequence, one mark per job.
JOB_SCOPE_PREFIX = "job:"
#: The store key of the job's record inside its scope (the job's own effects use any other key).
RECORD_KEY = "job"
#: The key each caller writes first, under the lease, to raise the scope's mark before it reads the record.
FENCE_KEY = "fence"
#: The default bound on a serialised result, in bytes.
RESULT_BYTES_MAX_DEFAULT = 64 * 1024
#: The greatest bound a caller may ask for (the record must fit in one store value).
RESULT_BYTES_CEILING = VALUE_BYTES_MAX // 2
#: A failed job's error is kept, cut to this many characters.
ERROR_CHARS_MAX = 500

State = Literal["started", "done"]


class JsonCodec:
    """The default result codec: compact JSON (UTF-8); a retry returns ``json.loads`` of what was stored."""

    @staticmethod
    def encode(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    @staticmethod
    def decode(text: str) -> Any:
        return json.loads(text)


def job_scope(key: object) -> str:
    """The scope of job ``key``: ``job:KEY`` (KEY: 1..196 of ``[A-Za-z0-9._:-]``).

    Raises:
        InvalidArgument: a key that cannot name a scope.
    """
    if not isinstance(key, str) or not 1 <= len(key) <= SCOPE_BYTES_MAX - len(JOB_SCOPE_PREFIX):
        raise InvalidArgument("key", f"must be 1..{SCOPE_BYTES_MAX - len(JOB_SCOPE_PREFIX)} characters")
    try:
        return validate_scope(JOB_SCOPE_PREFIX + key)
    except InvalidArgument:
        raise InvalidArgument("key", f"must be characters of [{SCOPE_CHARS}]") from None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the store holds about one job.

    Attributes:
        key: the job key.
        state: ``"started"`` (no result recorded: running, or died mid-run) or ``"done"``.
        holder: who started it (the lease's holder name).
        token_value: the token of the lease that started it.
        started_unix_ms, finished_unix_ms: wall-clock times (finished: 0 until done).
        result: the serialised result (None until done).
        fenced_by: the token value of a later holder that found the job started
            and raised the scope's mark over the starter's token (0: nobody yet).
        error: the exception the job raised, if it raised (cut to 500 characters).
        reconciled: the result was recorded by `stockade.recipes.jobs.reconcile`, not by the run.
    """

    key: str
    state: State
    holder: str
    token_value: int
    started_unix_ms: int
    finished_unix_ms: int = 0
    result: str | None = None
    fenced_by: int = 0
    error: str = ""
    reconciled: bool = False

    @property
    def uncertain(self) -> bool:
        """Started, and no result recorded: its effects may or may not have happened."""
        return self.state == "started"

    def finished(self, result: str, now_unix_ms: int, *, reconciled: bool = False) -> JobRecord:
        return replace(self, state="done", result=result, finished_unix_ms=now_unix_ms, reconciled=reconciled)


def encode_record(record: JobRecord) -> bytes:
    return json.dumps(asdict(record), separators=(",", ":")).encode()


def decode_record(raw: bytes) -> JobRecord:
    """A stored record back.

    Raises:
        InvalidArgument: the key holds something that is not a job record.
    """
    try:
        fields = json.loads(raw)
        record = JobRecord(**fields)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument("record", f"not a job record: {exc}") from None
    if record.state not in ("started", "done"):
        raise InvalidArgument("record", f"unknown job state {record.state!r}")
    return record


def encode_result(encode: Callable[[Any], str], value: Any, result_bytes_max: int) -> str:
    """``value`` serialised and checked against its bound.

    Raises:
        InvalidArgument: the codec cannot serialise it.
        LimitExceeded: it serialises to more than ``result_bytes_max`` bytes.
    """
    try:
        text = encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("result", f"cannot be serialised: {exc}") from None
    if not isinstance(text, str):
        raise InvalidArgument("result", "the codec must encode to a str")
    if len(text.encode()) > result_bytes_max:
        raise LimitExceeded("result_bytes_max", result_bytes_max, "bytes of a serialised job result")
    return text


def validate_result_bytes_max(value: object) -> int:
    return validate_int("result_bytes_max", value, 1, RESULT_BYTES_CEILING)


class JobUncertain(StockadeError):
    """The job was started and no result was recorded: its holder died or was cut off mid-run.

    Its effects may have happened, in part or in full; nothing re-runs it until
    someone looks and records what happened (`stockade.recipes.jobs.reconcile`) or
    clears it (`stockade.recipes.jobs.forget`).

    Attributes:
        key: the job key.
        holder: who started it.
        token_value: the token of the lease that started it.
        record: the whole `JobRecord`.
    """

    def __init__(self, record: JobRecord) -> None:
        self.key = record.key
        self.holder = record.holder
        self.token_value = record.token_value
        self.record = record
        detail = f"; it raised {record.error}" if record.error else ""
        super().__init__(
            f"job {record.key!r} was started by {record.holder!r} with token {record.token_value} and no result "
            f"was recorded{detail}: reconcile or forget it"
        )
