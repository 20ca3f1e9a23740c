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

The recipe is written once, over the async client (``recipes/_async/jobs.py``); the
sync one is generated from it (``recipes/_sync/jobs.py``, scripts/unasync.py). This
module gathers both, and what they share, under the one name users import.
"""

from stockade.recipes._async.jobs import forget_async, once_async, reconcile_async, status_async, uncertain_async
from stockade.recipes._jobs_record import (
    FENCE_KEY,
    JOB_SCOPE_PREFIX,
    JSON,
    RECORD_KEY,
    RESULT_BYTES_CEILING,
    RESULT_BYTES_MAX_DEFAULT,
    SCAN_SCOPES_MAX,
    TTL_MS_DEFAULT,
    WAIT_MS_DEFAULT,
    Codec,
    JobContext,
    JobRecord,
    JobUncertain,
    JsonCodec,
    encode_record,
    job_scope,
)
from stockade.recipes._sync.jobs import forget, once, reconcile, status, uncertain

__all__ = [
    "once", "once_async", "reconcile", "reconcile_async", "forget", "forget_async", "status", "status_async",
    "uncertain", "uncertain_async", "JobContext", "JobRecord", "JobUncertain", "JsonCodec", "Codec",
    "JOB_SCOPE_PREFIX", "RECORD_KEY", "RESULT_BYTES_MAX_DEFAULT", "RESULT_BYTES_CEILING", "job_scope",
    "SCAN_SCOPES_MAX", "encode_record", "JSON", "FENCE_KEY", "TTL_MS_DEFAULT", "WAIT_MS_DEFAULT",
]
