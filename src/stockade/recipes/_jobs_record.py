"""The record a fenced job leaves in its store, how a result is serialised, `JobUncertain`, and what the
sync and async recipes share (their arguments' checks, the codec protocol, how each side calls a job).

No I/O. The recipe (``recipes/_async/jobs.py``, its sync twin generated into ``_sync/``; both under the
name `stockade.recipes.jobs`) reads and writes these records through a fenced store, under the job's lease.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

from stockade.core.errors import InvalidArgument, LimitExceeded, StockadeError
from stockade.core.limits import (
    LIST_PAGE_MAX,
    SCOPE_BYTES_MAX,
    SCOPE_CHARS,
    VALUE_BYTES_MAX,
    validate_int,
    validate_scope,
)
from stockade.core.tokens import FencingToken

__all__ = [
    "JOB_SCOPE_PREFIX", "RECORD_KEY", "FENCE_KEY", "RESULT_BYTES_MAX_DEFAULT", "RESULT_BYTES_CEILING",
    "ERROR_CHARS_MAX",
    "JobRecord", "JobUncertain", "JsonCodec", "job_scope", "decode_record", "encode_record", "encode_result",
    "TTL_MS_DEFAULT", "WAIT_MS_DEFAULT", "SCAN_SCOPES_MAX", "Codec", "JobContext", "JSON", "AsyncJobCall", "JobCall",
    "now_ms", "checked_args", "error_text", "read_record", "scan_start", "page_done",
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


TTL_MS_DEFAULT = 30_000
WAIT_MS_DEFAULT = 30_000
#: Scopes one `uncertain` call looks at, at most.
SCAN_SCOPES_MAX = 100_000


class Codec(Protocol):
    """How results are serialised: ``encode(value) -> str`` and ``decode(str) -> value``."""

    def encode(self, value: Any) -> str: ...

    def decode(self, text: str) -> Any: ...


@dataclass(frozen=True)
class JobContext:
    """What a job is given.

    Attributes:
        key: the job key.
        scope: the job's scope (``job:KEY``); the job's own writes go there.
        token: the lease's token: pass it with every write of the job (``token=ctx.token``),
            so that a write sent after the lease was lost and the job taken over is refused.
        lease: the lease itself (``lease.lost``, ``lease.raise_if_lost()``).
    """

    key: str
    scope: str
    token: FencingToken
    lease: Any


#: The default codec (compact JSON).
JSON: Codec = JsonCodec()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def checked_args(key: object, fn: object, result_bytes_max: object, codec: object, *, needs_fn: bool = True) -> str:
    scope = job_scope(key)
    if needs_fn and not callable(fn):
        raise InvalidArgument("fn", "must be callable")
    validate_result_bytes_max(result_bytes_max)
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise InvalidArgument("codec", "must have encode(value) -> str and decode(str) -> value")
    return scope


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS_MAX]


def read_record(item: Any) -> JobRecord | None:
    return None if item is None else decode_record(item.value)


class AsyncJobCall:
    """How the async side calls a job: ``fn`` is a coroutine function, and only an `Exception` is the job's
    error (a cancellation, as when the lease is lost while it runs, is recorded as nothing: the record stays
    started, uncertain)."""

    recorded: tuple[type[BaseException], ...] = (Exception,)

    @staticmethod
    def check(fn: object) -> None:
        """Raises `InvalidArgument` unless ``fn`` is a coroutine function."""
        if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
            raise InvalidArgument("fn", "must be a coroutine function (async def); use once() for a plain function")


class JobCall:
    """How the sync side calls a job: any callable, and whatever it raises is kept in the record."""

    recorded: tuple[type[BaseException], ...] = (BaseException,)

    @staticmethod
    def check(fn: object) -> None:
        """Any callable will do (`checked_args` has seen that ``fn`` is one)."""


def scan_start(after: str, limit: int) -> str:
    """Where `uncertain` starts in the coordinator's scope list (``limit`` checked)."""
    validate_int("limit", limit, 1, LIST_PAGE_MAX)
    return job_scope(after) if after else JOB_SCOPE_PREFIX


def page_done(names: list[str], limit: int) -> tuple[list[str], bool]:
    """The job scopes of one page of scope names, and whether the scan ends with it."""
    jobs = [n for n in names if n.startswith(JOB_SCOPE_PREFIX)]
    return jobs, len(jobs) < len(names) or len(names) < limit
