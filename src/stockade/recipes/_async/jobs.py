"""Fenced jobs, written once as async code; the sync recipe in _sync/ is generated from this file.

Both are `stockade.recipes.jobs` (``stockade.jobs``), where the module's story is told
(docs/jobs.md). What the two sides do differently is said once, in
`stockade.recipes._jobs_record`: how each side calls a job (here `AsyncJobCall`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from stockade.client import AsyncCoordinator, AsyncFencedStore
from stockade.core.errors import InvalidArgument, StockadeError
from stockade.core.limits import LIST_PAGE_MAX
from stockade.recipes import _jobs_record
from stockade.recipes._jobs_record import (
    FENCE_KEY,
    JSON,
    RECORD_KEY,
    RESULT_BYTES_MAX_DEFAULT,
    SCAN_SCOPES_MAX,
    TTL_MS_DEFAULT,
    WAIT_MS_DEFAULT,
    Codec,
    JobContext,
    JobRecord,
    JobUncertain,
    checked_args,
    encode_record,
    encode_result,
    error_text,
    job_scope,
    now_ms,
    page_done,
    read_record,
    scan_start,
)

__all__ = ["once_async", "reconcile_async", "forget_async", "status_async", "uncertain_async"]


async def status_async(store: AsyncFencedStore, key: str) -> JobRecord | None:
    """The job's record as the store holds it (None: never started, or forgotten). Reads only."""
    return read_record(await store.get(job_scope(key), RECORD_KEY))


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
    """Run ``fn(ctx)`` for job ``key`` at most once in effect; return its (decoded) result.

    A job already done returns its recorded result without running (read
    without the lease: a done record changes only by `forget_async`). Otherwise the
    job's lease is taken (``ttl_ms``, waiting ``wait_ms``) and, under it, the
    record is read again and ``fn`` runs only if the job never started. In the
    async client ``fn`` is a coroutine function, and a lease lost while it runs
    cancels it (the ``lock()`` block raises `LeaseLost`): the record stays
    started, so the job is uncertain.

    Raises:
        JobUncertain: the job was started before and no result was recorded;
            this call raised the scope's mark over the starter's token first.
        LockTimeout: another caller held the job's lease for ``wait_ms``.
        LeaseLost: the lease lapsed while ``fn`` ran. In the sync client, if nobody
            took the job over, the record's writes were still accepted: the job is
            done and recorded, and calling `once_async` again returns its result.
        StaleToken: this call's lease was lost and someone else took the job
            over; this call's result was not recorded (the job is uncertain).
        InvalidArgument, LimitExceeded: bad input, or a result that cannot be
            serialised within ``result_bytes_max`` (the job ran: it stays uncertain).
        Whatever ``fn`` raised: the error is kept in the record, which stays
            started (uncertain): only the job knows which of its effects landed.
    """
    scope = checked_args(key, fn, result_bytes_max, codec)
    _jobs_record.AsyncJobCall.check(fn)
    record = read_record(await store.get(scope, RECORD_KEY))
    if record is not None and record.state == "done":
        return codec.decode(record.result or "null")
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder) as lease:
        token = lease.token
        # Raise the scope's mark first, then read: from here on no earlier holder's
        # write lands (its start, its effects, its result), so what is read stays true.
        await store.put(scope, FENCE_KEY, str(token.value), token=token)
        record = read_record(await store.get(scope, RECORD_KEY))
        if record is not None:
            if record.state == "done":
                return codec.decode(record.result or "null")
            fenced = replace(record, fenced_by=token.value)
            await store.put(scope, RECORD_KEY, encode_record(fenced), token=token)
            raise JobUncertain(fenced)
        started = JobRecord(key, "started", lease.holder, token.value, now_ms())
        await store.put(scope, RECORD_KEY, encode_record(started), token=token)
        try:
            text = encode_result(codec.encode, await fn(JobContext(key, scope, token, lease)), result_bytes_max)
        except _jobs_record.AsyncJobCall.recorded as exc:
            try:
                await store.put(scope, RECORD_KEY, encode_record(replace(started, error=error_text(exc))),
                                token=token)
            except StockadeError:
                pass  # the record stays started either way: uncertain
            raise
        await store.put(scope, RECORD_KEY, encode_record(started.finished(text, now_ms())), token=token)
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
    """Record ``result`` for a job that is uncertain (or was never run): it is done from now on.

    Raises:
        InvalidArgument: the job is done already (`forget_async` it first to change that).
    """
    scope = checked_args(key, None, result_bytes_max, codec, needs_fn=False)
    text = encode_result(codec.encode, result, result_bytes_max)
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        await store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = read_record(await store.get(scope, RECORD_KEY))
        if record is not None and record.state == "done":
            raise InvalidArgument("key", f"job {key!r} is done already; forget it first")
        if record is None:
            record = JobRecord(key, "started", lease.holder, lease.token.value, now_ms())
        done = record.finished(text, now_ms(), reconciled=True)
        await store.put(scope, RECORD_KEY, encode_record(done), token=lease.token)
        return done


async def forget_async(
    coord: AsyncCoordinator, store: AsyncFencedStore, key: str, *, ttl_ms: int = TTL_MS_DEFAULT,
    wait_ms: int = WAIT_MS_DEFAULT,
) -> JobRecord | None:
    """Delete the job's record, so that the next `once_async` runs it again; returns what it was.

    The job's own effects stay where they are: forget a job only once you know
    running it again is what you want.
    """
    scope = job_scope(key)
    async with coord.lock(scope, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        await store.put(scope, FENCE_KEY, str(lease.token.value), token=lease.token)
        record = read_record(await store.get(scope, RECORD_KEY))
        await store.delete(scope, RECORD_KEY, token=lease.token)
        return record


async def uncertain_async(
    coord: AsyncCoordinator, store: AsyncFencedStore, *, after: str = "", limit: int = 100
) -> list[JobRecord]:
    """Jobs started with no result recorded, in key order after job key ``after``, at most ``limit``.

    The job scopes are found in the coordinator's scope list (a coordinator that
    forgets idle scopes, as ``stockade serve`` does when its table is full, may
    have dropped one: `status_async` reads any job by key). At most `SCAN_SCOPES_MAX`
    scopes are looked at per call.
    """
    cursor = scan_start(after, limit)
    found: list[JobRecord] = []
    for _ in range(SCAN_SCOPES_MAX // LIST_PAGE_MAX):
        infos = await coord.scopes(after=cursor, limit=LIST_PAGE_MAX)
        names, last = page_done([s.scope for s in infos], LIST_PAGE_MAX)
        for name in names:
            record = read_record(await store.get(name, RECORD_KEY))
            if record is not None and record.uncertain:
                found.append(record)
                if len(found) >= limit:
                    return found
        if last or not names:
            break
        cursor = names[-1]
    return found
