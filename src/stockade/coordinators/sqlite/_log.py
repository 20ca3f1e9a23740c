"""The record log: a server's committed record changes, appended beside the coordinator file, folded in later.

PROTOTYPE (issue 29, step 1): measured before it is built for real.

``coord.log`` beside ``coord.db``, preallocated and zero-filled once (so an
``fdatasync`` of an append needs no metadata). A batch of changes is one
``pwrite`` of their frames at the current offset and one ``fdatasync``; only
then are they acknowledged (C1). Each frame: payload length, crc32, the log's
generation, a sequence number (1, 2, … within a generation), and the payload:
the scope's new record (waiters never: a server's durable records have none)
or a "forgotten" mark, with the time of the change.

Fold: past a threshold, at open and at a clean close, the pending changes are
applied to the coordinator file with `store_record`'s own writes (the journal
gets the same events, stamped with the frames' times) in ONE transaction that
also stores the next generation in the file's meta; then the log starts again
at offset 0 under that generation, so the old generation's frames are ignored.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

from stockade.coordinators.sqlite._journal import journal_change
from stockade.coordinators.sqlite._rows import set_meta, write_record
from stockade.core.errors import BackendUnavailable, StockadeError
from stockade.core.leases import Lease, ScopeRecord
from stockade.core.tokens import FencingToken

__all__ = ["RecordLog", "LOG_BYTES", "FOLD_FRAMES"]

LOG_BYTES = 8 * 1024 * 1024  # the preallocated size of the log
FOLD_FRAMES = 4096  # pending changes that start a fold
_FOLD_MARGIN_BYTES = 256 * 1024  # a fold starts once less than this is left in the file

_HEAD = struct.Struct("<IIQI")  # payload bytes, crc32 (of generation, seq, payload), generation, seq
_BODY = struct.Struct("<BqqqqqqqHHH")  # kind, at_ms, last_token, delay_until_ns, token, ttl_ms, granted, expires, lens
_GEN_SEQ = struct.Struct("<QI")
_NO_LEASE, _LEASE, _FORGOTTEN = 0, 1, 2
_META_KEY = "log_generation"

_log = logging.getLogger("stockade.server")

Change = tuple[ScopeRecord, ScopeRecord | None]


def encode_record(new: ScopeRecord | None, scope: str, at_ms: int) -> bytes:
    """One change's payload: ``scope`` became ``new`` (None: forgotten) at ``at_ms``."""
    scope_b = scope.encode()
    if new is None:
        return _BODY.pack(_FORGOTTEN, at_ms, 0, 0, 0, 0, 0, 0, len(scope_b), 0, 0) + scope_b
    lease = new.lease
    if lease is None:
        return _BODY.pack(_NO_LEASE, at_ms, new.last_token, new.delay_until_ns, 0, 0, 0, 0, len(scope_b), 0, 0) \
            + scope_b
    lid, holder = lease.lease_id.encode(), lease.holder.encode()
    return _BODY.pack(_LEASE, at_ms, new.last_token, new.delay_until_ns, lease.token.value, lease.ttl_ms,
                      lease.granted_ns, lease.expires_ns, len(scope_b), len(lid), len(holder)) + scope_b + lid + holder


def encode_frame(generation: int, seq: int, body: bytes) -> bytes:
    """One batch's frame: its changes' payloads (``body``), under the log's generation and the batch's number."""
    crc = zlib.crc32(body, zlib.crc32(_GEN_SEQ.pack(generation, seq)))
    return _HEAD.pack(len(body), crc, generation, seq) + body


def read_frames(data: bytes, generation: int, cluster_id: str) -> list[tuple[str, ScopeRecord | None, int]]:
    """The changes of the valid frames of ``generation`` from offset 0: ``(scope, new record or None, at_ms)``,
    up to the first frame that is torn, corrupt, of another generation or out of sequence."""
    out: list[tuple[str, ScopeRecord | None, int]] = []
    offset, seq, end = 0, 1, len(data)
    while offset + _HEAD.size <= end:
        size, crc, gen, frame_seq = _HEAD.unpack_from(data, offset)
        start = offset + _HEAD.size
        if gen != generation or frame_seq != seq or size < _BODY.size or start + size > end:
            break
        body = data[start:start + size]
        if zlib.crc32(body, zlib.crc32(_GEN_SEQ.pack(gen, frame_seq))) != crc:
            break
        at = 0
        while at < size:
            change, at = _decode(body, at, cluster_id)
            out.append(change)
        offset, seq = start + size, seq + 1
    return out


def _decode(body: bytes, at: int, cluster_id: str) -> tuple[tuple[str, ScopeRecord | None, int], int]:
    kind, at_ms, last_token, delay_ns, token, ttl_ms, granted_ns, expires_ns, n_scope, n_lid, n_holder = \
        _BODY.unpack_from(body, at)
    at += _BODY.size
    scope = body[at:at + n_scope].decode()
    end = at + n_scope + n_lid + n_holder
    if kind == _FORGOTTEN:
        return (scope, None, at_ms), end
    lease = None
    if kind == _LEASE:
        lid = body[at + n_scope:at + n_scope + n_lid].decode()
        holder = body[at + n_scope + n_lid:end].decode()
        lease = Lease(lid, holder, FencingToken(cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)
    return (scope, ScopeRecord(scope, last_token, lease, delay_ns), at_ms), end


class RecordLog:
    """The record log of one coordinator file (`SQLiteRecords`, opened exclusively by a server)."""

    def __init__(self, records: object, *, log_bytes: int = LOG_BYTES, fold_frames: int = FOLD_FRAMES) -> None:
        from stockade.coordinators.sqlite import SQLiteRecords  # noqa: PLC0415 - the package imports this module

        assert isinstance(records, SQLiteRecords)
        self.records = records
        self.path = Path(str(records.path) + ".log") if not str(records.path).endswith(".db") \
            else records.path.with_suffix(".log")
        self.log_bytes = log_bytes
        self.fold_frames = fold_frames
        self.pending: list[tuple[ScopeRecord, ScopeRecord | None, int]] = []
        self.offset = 0
        self.seq = 0
        self.folds = 0
        self.fd = self._open()
        with records._locked() as conn:
            row = conn.execute("SELECT v FROM meta WHERE k = ?", (_META_KEY,)).fetchone()
        self.generation = int(row[0]) if row else 0
        self._recover()

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if os.fstat(fd).st_size < self.log_bytes:
            os.posix_fallocate(fd, 0, self.log_bytes)
            zeros = bytes(1024 * 1024)
            for at in range(0, self.log_bytes, len(zeros)):
                os.pwrite(fd, zeros[:self.log_bytes - at], at)
            os.fsync(fd)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return fd

    def _recover(self) -> None:
        data = os.pread(self.fd, self.log_bytes, 0)
        frames = read_frames(data, self.generation, self.records.cluster_id)
        if not frames:
            self.fold()  # a new generation: frames of an older one never count again
            return
        current = self.records.records()
        for scope, new, at_ms in frames:
            old = current.get(scope) or ScopeRecord(scope)
            self.pending.append((old, new, at_ms))
            if new is None:
                current.pop(scope, None)
            else:
                current[scope] = new
        _log.info("record log: %d change(s) replayed", len(frames))
        self.fold()

    def commit_records(self, changes: Sequence[Change]) -> list[StockadeError | None]:
        """Append the changes' frames (one pwrite) and fdatasync them; then they are durable."""
        at_ms = time.time_ns() // 1_000_000
        seq = self.seq + 1
        buf = encode_frame(self.generation, seq,
                           b"".join([encode_record(new, old.scope, at_ms) for old, new in changes]))
        if self.offset + len(buf) > self.log_bytes:
            self.fold()
            return self.commit_records(changes)
        try:
            os.pwrite(self.fd, buf, self.offset)
            os.fdatasync(self.fd)
        except OSError as exc:
            raise BackendUnavailable(f"record log write failed: {exc}") from exc
        self.offset += len(buf)
        self.seq = seq
        pending = self.pending
        for old, new in changes:
            pending.append((old, new, at_ms))
        if len(pending) >= self.fold_frames or self.offset > self.log_bytes - _FOLD_MARGIN_BYTES:
            self.fold()
        return [None] * len(changes)

    def fold(self) -> None:
        """Apply the pending changes to the coordinator file and start the next generation, in one transaction."""
        pending, self.pending = self.pending, []
        with self.records._write() as conn:
            for old, new, at_ms in pending:
                journal_change(conn, old, new, at_ms)
            for old, new in _coalesced(pending):
                write_record(conn, old, new)
            set_meta(conn, _META_KEY, str(self.generation + 1))
        self.generation += 1
        self.offset = 0
        self.seq = 0
        self.folds += 1

    def close(self) -> None:
        self.fold()
        os.close(self.fd)


def _coalesced(pending: list[tuple[ScopeRecord, ScopeRecord | None, int]]) -> list[Change]:
    """The row writes of ``pending``: one per scope (its first old -> its last new), in order; a forget ends a
    scope's run (what comes after it starts from the empty record)."""
    runs: dict[str, list[ScopeRecord | None]] = {}
    out: list[Change] = []
    for old, new, _ in pending:
        run = runs.get(old.scope)
        if run is None:
            runs[old.scope] = [old, new]
        else:
            run[1] = new
        if new is None:
            first = runs.pop(old.scope)
            out.append((first[0], None))  # type: ignore[arg-type]
    out.extend((run[0], run[1]) for run in runs.values())  # type: ignore[misc]
    return out
