"""The record log: a server's record changes made durable by one append, folded into the coordinator file later.

``stockade serve`` keeps the lease table in memory (`stockade.server._leases`)
and hands each batch of changed records to `RecordLog.commit_records`. A batch
is ONE frame, written with one ``pwrite`` at the log's current offset and made
durable with one ``fdatasync``; only after that returns is any change of the
batch acknowledged (C1). The log (``coord.log`` beside ``coord.db``,
`log_path`) is preallocated and zero-filled once, so an append changes no file
size and its ``fdatasync`` writes no metadata.

A frame: a header (the payload's length, its crc32 (seeded with the file's
cluster id, so a log of another file never counts), the log's generation, the
frame's number: 1, 2, … within a generation) and the payload, each change's
new record as it will be stored (`encode_record`; waiters never, a server's
durable records have none) or a *forgotten* mark, with the wall-clock time of
the change (its history events are stamped with it).

One frame a batch, not one a change: a header and a crc a batch (issue 29:
the append's CPU per lock cycle, in batches of 3 cycles, went from about 40 to
28 µs with it, measured in-process).

Fold: before the first batch after `FOLD_CHANGES` changes are pending, or once
the log is nearly full, and at a clean close, the pending changes are
written into the coordinator file as the same rows a direct commit writes
(`apply_log_changes`: every change's history events in order, in a few
statements, then each scope's row once) in ONE transaction that also stores
the next generation in the file's meta (``log_generation``). From that
commit on, the log's frames belong to an old generation and count for
nothing; the next frame is written at offset 0 under the new generation.

Recovery (`replay_log`), in the opening transaction of every writer of the
file (a server's, and an embedded opener's, so a file a server left behind is
never opened without its acknowledged changes): the frames read from offset 0
that are of the stored generation, numbered 1, 2, 3, … with a valid crc, up to
the first that is not, are applied (old: the record as stored, new: the
frame's), and the generation moves on. A torn or corrupt tail ends the read;
no change of it was acknowledged, since its batch's ``fdatasync`` had not
returned. A log whose first frame is valid but of a LATER generation than the
file's belongs to a newer state of the file than this one (an older copy was
restored): it is not applied but moved aside (``coord.log.<generation>.stale``)
with a warning; the token epoch started by the opener keeps tokens rising
(docs/coordinator-files.md).

The operator's hand (docs/coordinator-files.md, "The log is part of the
file"): the log must be a regular file at its path (a link, FIFO or directory
is refused, never followed: `_open_preallocated`), and a log deleted, replaced
or truncated under the running server is written again at its path at the
next fold (`RecordLog._at_path`), so such damage loses at most what was
acknowledged before that fold.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from stockade.coordinators._record_diff import check_change
from stockade.coordinators.sqlite._journal import journal_changes
from stockade.coordinators.sqlite._rows import forgotten_floor, set_meta, write_record
from stockade.core.errors import BackendUnavailable, StockadeError
from stockade.core.leases import Lease, ScopeRecord
from stockade.core.tokens import FencingToken

__all__ = ["RecordLog", "LOG_BYTES", "FOLD_CHANGES",
           "FOLD_RACE_RETRIES", "GENERATION_KEY", "PendingChange", "log_path", "encode_record",
           "encode_frame", "cluster_seed", "read_changes", "stored_generation", "logged_changes", "logged_last_token",
           "read_generation", "generation_moved",
           "replay_log", "apply_log_changes", "overlay_records"]

#: The log's preallocated size. A fold starts before it is full (`FOLD_MARGIN_BYTES`), so a batch always fits.
LOG_BYTES = 4 * 1024 * 1024
#: Pending changes that start a fold (about 25 KB of frames in a lock cycle's records). The fold runs on the
#: event loop and every request waits for it: one of 256 changes takes about 1.1 ms, one of 1,024 about 3.1 ms
#: (measured in-process), and at 8 client processes the 99th percentile of a lock cycle was 3.5 ms with 256,
#: 4.0 with 512 and 5.6 with 1,024, at the same cycles/s (docs/coordinator-files.md).
FOLD_CHANGES = 256
#: A fold starts once less than this is left after the current offset: a batch's frame is far smaller
#: (at most `stockade.server._groupcommit.BATCH_OPS_MAX` records of at most ~500 bytes each, 256 KiB).
FOLD_MARGIN_BYTES = 512 * 1024
#: How often a reader of the file behind the server's back reads again when a fold raced its read (a fold takes
#: about a millisecond) before it gives up with `BackendUnavailable`.
FOLD_RACE_RETRIES = 5
#: The coordinator file's meta key holding the log's generation.
GENERATION_KEY = "log_generation"

_HEAD = struct.Struct("<IIQI")  # payload bytes, crc32 (of generation, number, payload), generation, number
_GEN_SEQ = struct.Struct("<QI")
# kind, at_unix_ms, last_token, delay_until_ns, token, ttl_ms, granted_ns, expires_ns; bytes of scope, id, holder
_BODY = struct.Struct("<BqqqqqqqHHH")
_NO_LEASE, _LEASE, _FORGOTTEN = 0, 1, 2
_ZEROS = bytes(1024 * 1024)
_READ_FIRST_BYTES = 64 * 1024  # a reader's first read of the log (`_read_log`)
_FRAME_BYTES_MAX = FOLD_MARGIN_BYTES  # no batch's frame is larger

_log = logging.getLogger("stockade.coordinators.sqlite")

#: A change as the log keeps it until its fold: (old record, new record or None: forgotten, at Unix ms).
PendingChange = tuple[ScopeRecord, ScopeRecord | None, int]


def log_path(db_path: str | os.PathLike[str]) -> Path:
    """The record log of a coordinator file: the same name with ``.log`` for its suffix (``coord.db`` ->
    ``coord.log``)."""
    path = Path(db_path)
    return path.with_name(path.name + ".log") if path.suffix in (".log", "") else path.with_suffix(".log")


def encode_record(new: ScopeRecord | None, scope: str, at_ms: int) -> bytes:
    """One change's payload: ``scope`` became ``new`` (None: forgotten) at ``at_ms`` (Unix ms)."""
    scope_b = scope.encode()
    if new is None:
        return _BODY.pack(_FORGOTTEN, at_ms, 0, 0, 0, 0, 0, 0, len(scope_b), 0, 0) + scope_b
    lease = new.lease
    if lease is None:
        return _BODY.pack(_NO_LEASE, at_ms, new.last_token, new.delay_until_ns, 0, 0, 0, 0, len(scope_b), 0, 0) \
            + scope_b
    lease_id, holder = lease.lease_id.encode(), lease.holder.encode()
    return _BODY.pack(_LEASE, at_ms, new.last_token, new.delay_until_ns, lease.token.value, lease.ttl_ms,
                      lease.granted_ns, lease.expires_ns, len(scope_b), len(lease_id), len(holder)) \
        + scope_b + lease_id + holder


def cluster_seed(cluster_id: str) -> int:
    """The crc32 every frame's crc starts from: the file's cluster id, so a log of another file never counts."""
    return zlib.crc32(cluster_id.encode())


def encode_frame(seed: int, generation: int, number: int, payload: bytes) -> bytes:
    """One batch's frame: its changes' payloads under the log's generation and the frame's number (``seed``:
    `cluster_seed`)."""
    crc = zlib.crc32(payload, zlib.crc32(_GEN_SEQ.pack(generation, number), seed))
    return _HEAD.pack(len(payload), crc, generation, number) + payload


def _valid_frame(data: bytes, offset: int, seed: int) -> tuple[int, int, bytes] | None:
    """``(generation, number, payload)`` of a whole frame with a right crc at ``offset``, else None."""
    if offset + _HEAD.size > len(data):
        return None
    size, crc, generation, number = _HEAD.unpack_from(data, offset)
    start = offset + _HEAD.size
    if size < _BODY.size or start + size > len(data):
        return None
    payload = data[start:start + size]
    if zlib.crc32(payload, zlib.crc32(_GEN_SEQ.pack(generation, number), seed)) != crc:
        return None
    return generation, number, payload


def read_changes(data: bytes, generation: int, cluster_id: str) -> list[tuple[str, ScopeRecord | None, int]]:
    """The changes of the frames of ``generation`` from offset 0: ``(scope, new record or None, at Unix ms)``,
    up to the first frame that is torn, corrupt, of another generation or out of sequence."""
    out: list[tuple[str, ScopeRecord | None, int]] = []
    offset, number, seed = 0, 1, cluster_seed(cluster_id)
    while (frame := _valid_frame(data, offset, seed)) is not None and frame[:2] == (generation, number):
        payload = frame[2]
        at = 0
        while at < len(payload):
            change, at = _decode(payload, at, cluster_id)
            out.append(change)
        offset, number = offset + _HEAD.size + len(payload), number + 1
    return out


def _decode(payload: bytes, at: int, cluster_id: str) -> tuple[tuple[str, ScopeRecord | None, int], int]:
    kind, at_ms, last_token, delay_ns, token, ttl_ms, granted_ns, expires_ns, n_scope, n_id, n_holder = \
        _BODY.unpack_from(payload, at)
    at += _BODY.size
    scope = payload[at:at + n_scope].decode()
    end = at + n_scope + n_id + n_holder
    if kind == _FORGOTTEN:
        return (scope, None, at_ms), end
    lease = None
    if kind == _LEASE:
        lease_id = payload[at + n_scope:at + n_scope + n_id].decode()
        holder = payload[at + n_scope + n_id:end].decode()
        lease = Lease(lease_id, holder, FencingToken(cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)
    return (scope, ScopeRecord(scope, last_token, lease, delay_ns), at_ms), end


def stored_generation(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (GENERATION_KEY,)).fetchone()
    return int(row[0]) if row else 0


def read_generation(conn: sqlite3.Connection) -> int | None:
    """For a reader of the file behind the server's back, first in its read transaction (this read takes the
    transaction's snapshot): the file's generation, to compare after the transaction (`generation_moved`); None
    if the file has no meta to read (the reader's own checks say what it is)."""
    try:
        return stored_generation(conn)
    except sqlite3.Error:
        return None


def generation_moved(conn: sqlite3.Connection, before: int | None) -> bool:
    """After a reader's read transaction (``conn`` out of it): whether a fold committed since ``before`` was read.

    Then the log the reader read may already have been written over by the next generation: the server writes the
    next generation's frame 1 at offset 0 right after the fold's COMMIT, and a read of the log racing that write
    can see it half written, a frame that is valid in neither generation. The reader would then lay no change
    over a file read before the fold: a grant the server acknowledged seen as never made (a store's last issued
    token too low). A first frame of the later generation, whole, is caught by `logged_changes`; a torn one only
    by this check: if the generation is the same after the log was read, no fold (and no write of the next
    generation) came before the read ended. The reader reads again.
    """
    if before is None:
        return False
    try:
        return stored_generation(conn) != before
    except sqlite3.Error:
        return False


def overlay_records(records: dict[str, ScopeRecord], changes: Sequence[tuple[str, ScopeRecord | None, int]]
                    ) -> list[PendingChange]:
    """Apply ``changes`` (from `read_changes`) to ``records`` (the file's, by scope; changed in place) and return
    them as ``(old, new, at_ms)``: what the log adds to the file, for a fold or a reader."""
    pending: list[PendingChange] = []
    for scope, new, at_ms in changes:
        old = records.get(scope) or ScopeRecord(scope)
        pending.append((old, new, at_ms))
        if new is None:
            records.pop(scope, None)
        else:
            records[scope] = new
    return pending


def apply_log_changes(conn: sqlite3.Connection, pending: Sequence[PendingChange]) -> None:
    """Write ``pending`` into the file in the caller's transaction: every change's history events in order (the
    rows a direct commit writes, stamped with the change's time, in a few statements: `journal_changes`), then
    each scope's row once (its first old -> its last new; a forget ends a scope's run, what follows starts from
    the empty record, and the forgotten floor keeps the run's last token)."""
    journal_changes(conn, pending)  # one executemany a journal move, not a statement an event
    runs: dict[str, list[ScopeRecord | None]] = {}
    for old, new, _ in pending:
        run = runs.get(old.scope)
        if run is None:
            runs[old.scope] = run = [old, new]
        run[1] = new
        if new is None:
            first = runs.pop(old.scope)[0]
            assert first is not None
            write_record(conn, first, None)
            if old.last_token > first.last_token:  # tokens given since the file's row: the floor keeps them (C1)
                set_meta(conn, "forgotten_floor", str(max(forgotten_floor(conn), old.last_token)))
    for first, last in runs.values():
        assert first is not None
        write_record(conn, first, last)


def _read_log(path: Path, seed: int) -> bytes | None:
    """The log's bytes from offset 0 as far as its run of frames goes (read in growing pieces: a folded log is one
    small read, not the whole preallocated file); None when there is no log (a file never served)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO put there must not hang the open
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackendUnavailable(f"cannot read the record log {path}: {exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or directory put there: say so, not "Illegal seek"
            raise BackendUnavailable(f"cannot read the record log {path}: not a regular file (the log must be a "
                                     "regular file beside the coordinator file)")
        want = _READ_FIRST_BYTES
        while True:
            data = os.pread(fd, want, 0)
            if len(data) < want or not _cut_short(data, seed):
                return data
            want *= 4
    except OSError as exc:
        raise BackendUnavailable(f"cannot read the record log {path}: {exc}") from exc
    finally:
        os.close(fd)


def _cut_short(data: bytes, seed: int) -> bool:
    """Whether the run of frames in ``data`` (one generation, numbered on) may go on past its end."""
    offset, expected = 0, None
    while (frame := _valid_frame(data, offset, seed)) is not None:
        if expected is not None and frame[:2] != expected:
            return False
        expected = (frame[0], frame[1] + 1)
        offset += _HEAD.size + len(frame[2])
    if offset + _HEAD.size > len(data):
        return True
    size = _HEAD.unpack_from(data, offset)[0]
    return offset + _HEAD.size + size > len(data) and size <= _FRAME_BYTES_MAX


def logged_changes(conn: sqlite3.Connection, db_path: Path, cluster_id: str
                   ) -> tuple[list[tuple[str, ScopeRecord | None, int]], bool]:
    """For a reader of the file (``conn`` in a read transaction): the changes the log holds beyond what the file
    holds (`read_changes`), and whether a fold raced the read (the log is already of a later generation than the
    file as read: read again)."""
    data = _read_log(log_path(db_path), cluster_seed(cluster_id))
    if data is None:
        return [], False
    generation = stored_generation(conn)
    first = _valid_frame(data, 0, cluster_seed(cluster_id))
    if first is not None and first[0] > generation:
        return [], True
    return read_changes(data, generation, cluster_id), False


def logged_last_token(conn: sqlite3.Connection, db_path: Path, scope: str) -> int | None:
    """``scope``'s greatest last token in the log beyond the file as read by ``conn`` (0: none; None: a fold
    raced the read, read again). For a store beside the file (`stockade.resources._issued`)."""
    row = conn.execute("SELECT v FROM meta WHERE k = 'cluster_id'").fetchone()
    changes, raced = logged_changes(conn, db_path, row[0] if row else "")
    if raced:
        return None
    return max((new.last_token for name, new, _ in changes if name == scope and new is not None), default=0)


def replay_log(conn: sqlite3.Connection, db_path: Path, cluster_id: str,
               records: Callable[[], dict[str, ScopeRecord]]) -> int:
    """Apply the log's frames of the file's generation in the opener's transaction and move the generation on;
    returns how many changes were applied. No log: nothing (a file never served). A log of a later generation
    than the file's is moved aside, not applied (an older copy of the file was restored)."""
    path = log_path(db_path)
    data = _read_log(path, cluster_seed(cluster_id))
    if data is None:
        return 0
    generation = stored_generation(conn)
    first = _valid_frame(data, 0, cluster_seed(cluster_id))
    if first is not None and first[0] > generation:
        aside = path.with_name(f"{path.name}.{first[0]}.stale")
        _log.warning("record log %s is of generation %d, later than the file's %d (an older copy of the file was "
                     "restored?): not applied, moved to %s; tokens keep rising with the new epoch",
                     path, first[0], generation, aside)
        os.replace(path, aside)
        return 0
    changes = read_changes(data, generation, cluster_id)
    if changes:
        apply_log_changes(conn, overlay_records(records(), changes))
        _log.info("record log %s: %d acknowledged change(s) applied to the file", path, len(changes))
    set_meta(conn, GENERATION_KEY, str(generation + 1))
    return len(changes)


class RecordLog:
    """The record log of one coordinator file, for its only writer (a server: the file is open exclusively).

    Args:
        path: the log (`log_path` of the file).
        cluster_id: the file's cluster id (every frame's crc starts from it).
        generation: the file's stored generation (the one `replay_log` moved on to).
        fold: writes the pending changes into the file and stores the next generation, in one transaction
            (`stockade.coordinators.sqlite.SQLiteRecords.fold_log`); raises `BackendUnavailable` if it failed.
        log_bytes, fold_changes: the log's size, and the pending changes that start a fold.

    Raises:
        BackendUnavailable: the log cannot be created or preallocated.
    """

    def __init__(self, path: Path, cluster_id: str, generation: int,
                 fold: Callable[[Sequence[PendingChange], int], None], *,
                 log_bytes: int = LOG_BYTES, fold_changes: int = FOLD_CHANGES) -> None:
        if log_bytes < 2 * FOLD_MARGIN_BYTES:
            raise ValueError(f"log_bytes {log_bytes} below {2 * FOLD_MARGIN_BYTES}")
        self.path = path
        self._seed = cluster_seed(cluster_id)
        self.generation = generation
        self._fold = fold
        self.log_bytes = log_bytes
        self.fold_changes = fold_changes
        self.pending: list[PendingChange] = []
        self.offset = 0  # where the next frame goes
        self.number = 0  # the last frame's number in this generation
        self.folds = 0  # folds into the file so far
        self.appends = 0  # frames appended so far: one fdatasync each
        self.bytes_written = 0  # their bytes
        # Held by an append and a fold: a reader of the file that folds first (`fold_now`) runs on another thread
        # (an append meanwhile waits for its fold: a few ms).
        self.lock = threading.Lock()
        self.fd = _open_preallocated(path, log_bytes)
        self.astray = False  # the log at the path is not the one written here: reopened at the next fold

    def commit_records(self, changes: Sequence[tuple[ScopeRecord, ScopeRecord | None]]
                       ) -> list[StockadeError | None]:
        """Append ``changes`` as one frame and ``fdatasync`` it: once this returns, they are durable.

        A fold due (`FOLD_CHANGES` pending, or less than `FOLD_MARGIN_BYTES` left: a frame is smaller) is made
        first, so the frame always fits.

        Raises:
            BackendUnavailable: the fold, the write or the sync failed: nothing of the batch is acknowledged (its
                frame, if it reached the disk, is overwritten by the next one, numbered the same).
            InvariantViolation: a change would lower its scope's last token (C1): nothing of the batch is
                written (a fold applies a scope's changes as one row write, which would not see it go back).
        """
        at_ms = time.time_ns() // 1_000_000
        for old, new in changes:
            if new is not None and (new.last_token < old.last_token or new.scope != old.scope):
                check_change(old, new)  # raises: never in the log, where a fold would write it (C1)
        with self.lock:
            if self.fold_due():
                self._fold_locked()  # due since the last batch; failing, it fails this batch (nothing written)
            number = self.number + 1
            frame = encode_frame(self._seed, self.generation, number,
                                 b"".join([encode_record(new, old.scope, at_ms) for old, new in changes]))
            if len(frame) > _FRAME_BYTES_MAX:  # a batch is at most BATCH_OPS_MAX small records: never
                raise BackendUnavailable(f"record log {self.path}: a batch of {len(frame)} bytes",
                                         certain_no_effect=True)
            try:
                os.pwrite(self.fd, frame, self.offset)
                os.fdatasync(self.fd)
            except OSError as exc:
                raise BackendUnavailable(f"record log {self.path}: write failed: {exc}") from exc
            self.offset += len(frame)
            self.number = number
            self.appends += 1
            self.bytes_written += len(frame)
            pending = self.pending
            for old, new in changes:
                pending.append((old, new, at_ms))
        return [None] * len(changes)

    def fold_due(self) -> bool:
        """Whether the next batch folds the log first (`FOLD_CHANGES` pending, or the log nearly full, or the log
        at the path still to be reopened: `_follow_path`)."""
        return len(self.pending) >= self.fold_changes or self.offset > self.log_bytes - FOLD_MARGIN_BYTES \
            or self.astray

    def fold_now(self) -> None:
        """Fold what is pending (before a read of the file that must see every acknowledged change)."""
        with self.lock:
            self._fold_locked()

    def _fold_locked(self, follow: bool = True) -> None:
        if self.pending or self.number:  # else nothing written in this generation: nothing to fold
            self._fold(self.pending, self.generation + 1)
            self.pending = []
            self.generation += 1
            self.offset = 0
            self.number = 0
            self.folds += 1
            if not self.astray and not self._at_path():
                _log.warning("record log %s was deleted, replaced or truncated while the server ran: the changes "
                             "acknowledged since the fold before may have been only in the file the server had open; "
                             "writing the log there again", self.path)
                self.astray = True
        if self.astray and follow:
            self._follow_path()

    def _at_path(self) -> bool:
        """Whether the file this log writes is still the one at its path (not deleted, renamed or replaced), at its
        preallocated size (not truncated: appends past its end would change its size, and sync metadata)."""
        try:
            there = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino) and mine.st_size >= self.log_bytes

    def _follow_path(self) -> None:
        """Write from now on to a log at the path again, created if missing: right after a fold, nothing pending.

        Frames appended to a log that was deleted (or replaced) while the server ran are durable only in a file no
        opener will read: a kill -9 loses them. Checked at each fold (two system calls every `FOLD_CHANGES`
        changes, not two a batch), so the changes acknowledged between the deletion and the next fold are the
        most that can be lost (docs/coordinator-files.md). Failing (a full disk), it fails the batch that folded
        and stays due, so every next batch tries again before it appends.
        """
        fd = _open_preallocated(self.path, self.log_bytes)
        os.close(self.fd)
        self.fd, self.astray = fd, False

    def close(self) -> None:
        """Fold what is pending and close the log (a clean stop leaves no change only in the log). A fold that
        fails (a full disk) is logged: the changes stay in the log, and the next opener applies them."""
        try:
            with self.lock:
                self._fold_locked(follow=False)  # nothing is appended after it: no new log at the path
        except StockadeError as exc:
            _log.error("record log %s: the fold at close failed; its changes stay in the log and are applied when "
                       "the file is next opened: %s", self.path, exc)
        finally:
            os.close(self.fd)


def _open_preallocated(path: Path, log_bytes: int) -> int:
    """The log's descriptor, the file created (mode 0600) and filled with zeros to ``log_bytes`` if shorter.

    Only a regular file at ``path`` itself: a symbolic link is not followed (``O_NOFOLLOW``), and a FIFO, device
    or directory is refused, before anything is written. A log that is a link to another file would be zeroed and
    overwritten from offset 0: ``ln -s coord.db coord.log`` destroyed the coordinator file itself.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        hint = " (a symbolic link: the log must be a regular file beside the coordinator file)" \
            if exc.errno == errno.ELOOP else ""
        raise BackendUnavailable(f"cannot open the record log {path}: {exc}{hint}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BackendUnavailable(f"cannot open the record log {path}: not a regular file (the log must be a regular "
                                 "file beside the coordinator file)")
    try:
        if os.fstat(fd).st_size < log_bytes:
            os.posix_fallocate(fd, 0, log_bytes)
            for at in range(0, log_bytes, len(_ZEROS)):  # written once: later appends allocate nothing
                os.pwrite(fd, _ZEROS[:log_bytes - at], at)
            os.fsync(fd)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as exc:
        os.close(fd)
        raise BackendUnavailable(f"cannot preallocate the record log {path} ({log_bytes} bytes): {exc}") from exc
    return fd
