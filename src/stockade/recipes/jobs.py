"""Fenced jobs: run a job at most once in effect, and say so when that cannot be known.

``once(coord, store, key, fn)`` takes the lease of the job's scope
(``job:KEY``), raises the scope's high-water mark to the lease's token (a
write to ``fence``), so that nothing an earlier holder still sends can land,
and only then reads the job's record. If the job never started, it records,
with the same token, that the job started, calls ``fn(ctx)`` (``ctx.token`` fences the job's own writes,
which go to the same scope), and records its result with the same token. A
retry, by anyone, returns the recorded result without running the job. A
holder that dies (or is cut off) mid-run leaves the record *started*: the next
caller raises the scope's mark over the starter's token (so nothing the starter
still sends can land) and raises `JobUncertain` rather than run the job again.
Someone who knows what happened records it with `reconcile` or clears the job
with `forget`; `uncertain` lists such jobs.

Results are serialised with a codec (JSON by default, `JsonCodec`) and bounded
(``result_bytes_max``, 64 KiB by default): a retry returns the decoded value, and
so does the first call, so both see the same thing. See docs/jobs.md.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from stockade.client import AsyncCoordinator, AsyncFencedStore, Coordinator, FencedStore
from stockade.core.errors import InvalidArgument, StockadeError
from stockade.core.limits import LIST_PAGE_MAX, validate_int
from stockade.core.tokens import FencingToken
from stockade.recipes._jobs_record import (
    ERROR_CHARS_MAX,
    FENCE_KEY,
    JOB_SCOPE_PREFIX,
    RECORD_KEY,
    RESULT_BYTES_CEILING,
    RESULT_BYTES_MAX_DEFAULT,
    JobRecord,
    JobUncertain,
    JsonCodec,
    decode_record,
    encode_record,
    encode_result,
    job_scope,
    validate_result_bytes_max,
)

__all__ = [
    "once", "once_async", "reconcile", "reconcile_async", "forget", "forget_async", "status", "status_async",
    "uncertain", "uncertain_async", "JobContext", "JobRecord", "JobUncertain", "JsonCodec", "Codec",
    "JOB_SCOPE_PREFIX", "RECORD_KEY", "RESULT_BYTES_MAX_DEFAULT", "RESULT_BYTES_CEILING", "job_scope",
    "SCAN_SCOPES_MAX", "encode_record", "JSON", "FENCE_KEY",
]

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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _checked(key: object, fn: object, result_bytes_max: object, codec: object, *, needs_fn: bool = True) -> str:
    scope = job_scope(key)
    if needs_fn and not callable(fn):
        raise InvalidArgument("fn", "must be callable")
    validate_result_bytes_max(result_bytes_max)
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise InvalidArgument("codec", "must have encode(value) -> str and decode(str) -> value")
    return scope


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS_MAX]


def _read(item: Any) -> JobRecord | None:
    return None if item is None else decode_record(item.value)


# -- sync ----------------------------------------------------------------------------------------


def status(store: FencedStore, key: str) -> JobRecord | None:
    """The job's record as the store holds it (None: never started, or forgotten). Reads only."""
    return _read(store.get(job_scope(key), RECORD_KEY))


def once(
    coord: Coordinator,
    store: FencedStore,
    key: str,
    fn: Callable[[JobContext], Any],
    *,
    ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
    holder: str | None = None,
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT,
    codec: Codec = JSON,
) -> Any:
    """Run ``fn(ctx)`` for job ``key`` at most once in effect; return its (decoded) result.

    A job already done returns its recorded result without running (read
    without the lease: a done record changes only by `forget`). Otherwise the
    job's lease is taken (``ttl_ms``, waiting ``wait_ms``) and, under it, the
    record is read again and ``fn`` runs only if the job never started.

    Raises:
        JobUncertain: the job was started before and no result was recorded;
            this call raised the scope's mark over the starter's token first.
        LockTimeout: another caller held the job's lease for ``wait_ms``.
        LeaseLost: the lease lapsed while ``fn`` ran and nobody took the job
            over, so the record's writes were still accepted: the job is done
            and recorded, and calling `once` again returns its result.
        StaleToken: this call's lease was lost and someone else took the job
            over; this call's result was not recorded (the job is uncertain).
        InvalidArgument, LimitExceeded: bad input, or a result that cannot be
            serialised within ``result_bytes_max`` (the job ran: it stays uncertain).
        Whatever ``fn`` raised: the error is kept in the record, which stays
            started (uncertain): only the job knows which of its effects landed.
    """
    scope = _checked(key, fn, result_bytes_max, codec)
    record = _read(store.get(scope, RECORD_KEY))
    if record is not None and record.state == "done":
        return codec.decode(record.result or "null")
    with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder) as lease:
        token = lease.token
        # Raise the scope's mark first, then read: from here on no earlier holder's
        # write lands (its start, its effects, its result), so what is read stays true.
        store.put(scope, FENCE_KEY, str(token.value), token=token)
        record = _read(store.get(scope, RECORD_KEY))
        if record is not None:
            if record.state == "done":
                return codec.decode(record.result or "null")
            fenced = replace(record, fenced_by=token.value)
            store.put(scope, RECORD_KEY, encode_record(fenced), token=token)
            raise JobUncertain(fenced)
        started = JobRecord(key, "started", lease.holder, token.value, _now_ms())
        store.put(scope, RECORD_KEY, encode_record(started), token=token)
        try:
            text = encode_result(codec.encode, fn(JobContext(key, scope, token, lease)), result_bytes_max)
        except BaseException as exc:
            try:
                store.put(scope, RECORD_KEY, encode_record(replace(started, error=_error_text(exc))), token=token)
            except StockadeError:
                pass  # the record stays started either way: uncertain
            raise
        store.put(scope, RECORD_KEY, encode_record(started.finished(text, _now_ms())), token=token)
        return codec.decode(text)


def reconcile(
    coord: Coordinator,
    store: FencedStore,
    key: str,
    *,
    result: Any,
    ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT,
    codec: Codec = JSON,
) -> JobRecord:
    """Record ``result`` for a job that is uncertain (or was never run): it is done from now on.

    Raises:
        InvalidArgument: the job is done already (`forget` it first to change that).
    """
    scope = _checked(key, None, result_bytes_max, codec, needs_fn=False)
    text = encode_result(codec.encode, result, result_bytes_max)
    with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = _read(store.get(scope, RECORD_KEY))
        if record is not None and record.state == "done":
            raise InvalidArgument("key", f"job {key!r} is done already; forget it first")
        if record is None:
            record = JobRecord(key, "started", lease.holder, lease.token.value, _now_ms())
        done = record.finished(text, _now_ms(), reconciled=True)
        store.put(scope, RECORD_KEY, encode_record(done), token=lease.token)
        return done


def forget(
    coord: Coordinator, store: FencedStore, key: str, *, ttl_ms: int = TTL_MS_DEFAULT, wait_ms: int = WAIT_MS_DEFAULT
) -> JobRecord | None:
    """Delete the job's record, so that the next `once` runs it again; returns what it was.

    The job's own effects stay where they are: forget a job only once you know
    running it again is what you want.
    """
    scope = job_scope(key)
    with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = _read(store.get(scope, RECORD_KEY))
        store.delete(scope, RECORD_KEY, token=lease.token)
        return record


def _scan_args(after: str, limit: int) -> str:
    validate_int("limit", limit, 1, LIST_PAGE_MAX)
    return job_scope(after) if after else JOB_SCOPE_PREFIX


def _page_done(names: list[str], limit: int) -> tuple[list[str], bool]:
    jobs = [n for n in names if n.startswith(JOB_SCOPE_PREFIX)]
    return jobs, len(jobs) < len(names) or len(names) < limit


def uncertain(coord: Coordinator, store: FencedStore, *, after: str = "", limit: int = 100) -> list[JobRecord]:
    """Jobs started with no result recorded, in key order after job key ``after``, at most ``limit``.

    The job scopes are found in the coordinator's scope list (a coordinator that
    forgets idle scopes, as ``stockade serve`` does when its table is full, may
    have dropped one: `status` reads any job by key). At most `SCAN_SCOPES_MAX`
    scopes are looked at per call.
    """
    cursor = _scan_args(after, limit)
    found: list[JobRecord] = []
    for _ in range(SCAN_SCOPES_MAX // LIST_PAGE_MAX):
        names, last = _page_done([s.scope for s in coord.scopes(after=cursor, limit=LIST_PAGE_MAX)], LIST_PAGE_MAX)
        for name in names:
            record = _read(store.get(name, RECORD_KEY))
            if record is not None and record.uncertain:
                found.append(record)
                if len(found) >= limit:
                    return found
        if last or not names:
            break
        cursor = names[-1]
    return found


# -- async ---------------------------------------------------------------------------------------


async def status_async(store: AsyncFencedStore, key: str) -> JobRecord | None:
    """`status` for the async client."""
    return _read(await store.get(job_scope(key), RECORD_KEY))


async def once_async(
    coord: AsyncCoordinator,
    store: AsyncFencedStore,
    key: str,
    fn: Callable[[JobContext], Awaitable[Any]],
    *,
    ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
    holder: str | None = None,
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT,
    codec: Codec = JSON,
) -> Any:
    """`once` for the async client: ``fn`` is a coroutine function.

    A lease lost while ``fn`` runs cancels it (the ``lock()`` block raises
    `LeaseLost`); the record stays started, so the job is uncertain.
    """
    scope = _checked(key, fn, result_bytes_max, codec)
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        raise InvalidArgument("fn", "must be a coroutine function (async def); use once() for a plain function")
    record = _read(await store.get(scope, RECORD_KEY))
    if record is not None and record.state == "done":
        return codec.decode(record.result or "null")
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder) as lease:
        token = lease.token
        await store.put(scope, FENCE_KEY, str(token.value), token=token)  # the mark first, then read
        record = _read(await store.get(scope, RECORD_KEY))
        if record is not None:
            if record.state == "done":
                return codec.decode(record.result or "null")
            fenced = replace(record, fenced_by=token.value)
            await store.put(scope, RECORD_KEY, encode_record(fenced), token=token)
            raise JobUncertain(fenced)
        started = JobRecord(key, "started", lease.holder, token.value, _now_ms())
        await store.put(scope, RECORD_KEY, encode_record(started), token=token)
        try:
            text = encode_result(codec.encode, await fn(JobContext(key, scope, token, lease)), result_bytes_max)
        except Exception as exc:
            try:
                await store.put(scope, RECORD_KEY, encode_record(replace(started, error=_error_text(exc))),
                                token=token)
            except StockadeError:
                pass
            raise
        await store.put(scope, RECORD_KEY, encode_record(started.finished(text, _now_ms())), token=token)
        return codec.decode(text)


async def reconcile_async(
    coord: AsyncCoordinator,
    store: AsyncFencedStore,
    key: str,
    *,
    result: Any,
    ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT,
    codec: Codec = JSON,
) -> JobRecord:
    """`reconcile` for the async client."""
    scope = _checked(key, None, result_bytes_max, codec, needs_fn=False)
    text = encode_result(codec.encode, result, result_bytes_max)
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        await store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = _read(await store.get(scope, RECORD_KEY))
        if record is not None and record.state == "done":
            raise InvalidArgument("key", f"job {key!r} is done already; forget it first")
        if record is None:
            record = JobRecord(key, "started", lease.holder, lease.token.value, _now_ms())
        done = record.finished(text, _now_ms(), reconciled=True)
        await store.put(scope, RECORD_KEY, encode_record(done), token=lease.token)
        return done


async def forget_async(
    coord: AsyncCoordinator, store: AsyncFencedStore, key: str, *, ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
) -> JobRecord | None:
    """`forget` for the async client."""
    scope = job_scope(key)
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        await store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = _read(await store.get(scope, RECORD_KEY))
        await store.delete(scope, RECORD_KEY, token=lease.token)
        return record


async def uncertain_async(
    coord: AsyncCoordinator, store: AsyncFencedStore, *, after: str = "", limit: int = 100
) -> list[JobRecord]:
    """`uncertain` for the async client."""
    cursor = _scan_args(after, limit)
    found: list[JobRecord] = []
    for _ in range(SCAN_SCOPES_MAX // LIST_PAGE_MAX):
        infos = await coord.scopes(after=cursor, limit=LIST_PAGE_MAX)
        names, last = _page_done([s.scope for s in infos], LIST_PAGE_MAX)
        for name in names:
            record = _read(await store.get(name, RECORD_KEY))
            if record is not None and record.uncertain:
                found.append(record)
                if len(found) >= limit:
                    return found
        if last or not names:
            break
        cursor = names[-1]
    return found
