"""A fenced directory: each scope's files and its high-water mark side by side (docs/fence-files.md).

Layout (every name is one path step; nothing resolves ``.``, ``..`` or a link)::

    root/
      .stockade-fence          cluster id and the default floor (JSON; replaced atomically)
      .stockade-lock           flock: one floor (or opening) at a time
      <scope>/                 one directory per scope (`validate_scope` refuses ``.`` and ``..``)
        .stockade-lock         flock: one batch of the scope at a time, across threads and processes
        .stockade-high-water   the scope's mark (decimal; replaced atomically)
        <name> ...             the user's files

A batch (`FencedDirectory.batch`) takes the scope's lock when it opens and
checks the token there (MAC, R2, R1 through `stockade.core.fence`); its writes
go to fsync'd temporary files at once; when it ends, it persists a raised mark
first (temp, fsync, rename, fsync the directory), then renames each file into
place and fsyncs the directory once. The lock is held from the check to the
last rename, so a higher token's batch waits for an open lower one (R6), and
the mark on disk is never behind the data it admitted, even across a kill -9
(the mark's rename is durable before the first data rename).

Atomicity: each file is replaced atomically (old or new, never torn). A batch
of several files is *not* atomic across files under a crash: a writer killed
during its renames leaves some files new and some old (the mark already
raised, so no older token can write in between). Without a crash, nobody sees
a half-applied batch through this API: readers of `read` do not take the lock,
so a reader may see files of a batch in the middle of its renames.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.fence import FenceRule, decide
from stockade.core.limits import TOKEN_VALUE_MAX, TX_WRITES_MAX, VALUE_BYTES_CEILING, validate_int, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources._admit import admit_mark, effective_mark
from stockade.resources._inputs import check_floors
from stockade.resources._verified_tokens import VerifiedTokens
from stockade.resources._verify import TOKENLESS, UNSIGNED, Verification, check_keys_given, refuse_unsigned_after_signed
from stockade.resources.files import _io as fio

__all__ = ["FencedDirectory", "FileBatch", "open_floor_target", "UNSIGNED", "FILE_BYTES_MAX_DEFAULT",
           "LOCK_WAIT_MS_DEFAULT"]

FILE_BYTES_MAX_DEFAULT = VALUE_BYTES_CEILING  # 16 MiB: a file written or read in one piece
LOCK_WAIT_MS_DEFAULT = 30_000
LOCK_WAIT_MS_MAX = 300_000
OPEN_SCOPES_MAX = 64  # scopes whose directory and lock a handle keeps open
SYNC_THREADS_MAX = 4  # helper threads a handle syncs raised marks on (started on the first raise, ended by close)
_KIND = "stockade-files"
_VERSION = 1
_META_BYTES_MAX = 2048
_MARK_BYTES_MAX = 32

# How a raised mark reaches the disk before the data it admits (`FencedDirectory._raise_beside`): "in-place"
# (overwritten and synced beside the data's own sync). The controls: "replace", the mark renamed into place
# after the data's sync (four syncs a write, the work-budget test's); "unordered", the data renamed without
# waiting for the mark's sync (the ordering test's).
mark_writes = "in-place"


def _validate_scope(scope: object) -> str:
    scope = validate_scope(scope)
    if scope.startswith(fio.RESERVED_PREFIX):
        raise InvalidArgument("scope", f"scopes starting with {fio.RESERVED_PREFIX!r} are the fence's own")
    return scope


class FileBatch:
    """The writes of one fenced batch on one scope; applied when the ``with`` block ends.

    Made by `FencedDirectory.batch`; the token was checked when it opened.
    """

    def __init__(self, directory: FencedDirectory, scope: str, scope_fd: int, accepted: int, own: int | None) -> None:
        self.scope = scope
        self._dir = directory
        self._fd = scope_fd
        self._accepted = accepted
        self._own = own
        self._pending: dict[str, str | None] = {}  # name -> temp file (None: delete), in call order

    def write(self, name: str, data: bytes | str) -> None:
        """Stage ``name`` with ``data`` (written to a fsync'd temporary file now, renamed into place at the end).

        Raises:
            InvalidArgument: a bad name, data over ``file_bytes_max``, or too many files in one batch.
            BackendUnavailable: disk full or read-only (the batch applies nothing).
        """
        name = fio.validate_name(name)
        self._stage(name, fio.write_temp(self._fd, self._dir._checked_data(data)))

    def delete(self, name: str) -> None:
        """Stage the removal of ``name`` (nothing if it does not exist when the batch ends)."""
        self._stage(fio.validate_name(name), None)

    def _stage(self, name: str, temp: str | None) -> None:
        if name not in self._pending and len(self._pending) >= TX_WRITES_MAX:
            if temp is not None:
                fio.discard(self._fd, temp)
            raise InvalidArgument("batch", f"at most {TX_WRITES_MAX} files in one batch")
        earlier = self._pending.pop(name, None)
        if earlier is not None:
            fio.discard(self._fd, earlier)
        self._pending[name] = temp

    def read(self, name: str) -> bytes | None:
        """``name`` as this batch sees it: its own staged write, else the file on disk (None if none)."""
        name = fio.validate_name(name)
        if name in self._pending:
            temp = self._pending[name]
            return None if temp is None else fio.read_small(temp, self._fd, self._dir.file_bytes_max)
        return fio.read_small(name, self._fd, self._dir.file_bytes_max)

    def _discard(self) -> None:
        for temp in self._pending.values():
            if temp is not None:
                fio.discard(self._fd, temp)
        self._pending.clear()

    def _apply(self) -> None:
        if not self._pending and (self._own is not None and self._accepted <= self._own):
            return
        if self._own is None or self._accepted > self._own:
            # The mark first, durably: a crash after any data rename finds the mark already raised.
            # (The temporary files are synced already: the mark's sync is the only one before the renames.)
            if mark_writes == "replace" or not fio.overwrite_mark(self._fd, self._accepted):
                fio.replace_durably(self._fd, fio.MARK_NAME, fio.mark_bytes(self._accepted))
        renamed = 0
        try:
            for name, temp in list(self._pending.items()):
                if temp is None:
                    try:
                        os.unlink(name, dir_fd=self._fd)
                    except FileNotFoundError:
                        pass
                else:
                    fio.replace(self._fd, temp, name)
                del self._pending[name]
                renamed += 1
            fio.sync_dir(self._fd)
        except OSError as exc:
            self._discard()
            raise fio.failed(f"batch on scope {self.scope!r} failed after {renamed} files", exc,
                             certain_no_effect=renamed == 0) from exc


class FencedDirectory:
    """A directory of files fenced per scope (see the module docstring for the layout and guarantees).

    Local POSIX filesystems only (docs/fence-files.md says why not NFS or SMB).

    Args:
        path: the directory (created if missing; a link at ``path`` itself is followed once,
            nothing inside it is).
        keys: what verifies token MACs (``coord.verify_keys()``, a `stockade.keys.KeyFile`,
            `stockade.keys.FixedKeys`, a keyring path, or ``"unsigned"``: no check, unsafe). None is
            refused (L2), and so is ``"unsigned"`` on a directory once opened with keys.
        cluster_id: the trusted cluster (default: the keys').
        file_bytes_max: the largest file written or read, in bytes.
        lock_wait_ms: how long a batch or the floor waits for a lock before `BackendUnavailable`.

    Attributes:
        fence_rule: the comparison (`stockade.core.fence.decide`); a seam for the controls.

    Raises:
        InvalidArgument: bad arguments, or a directory fenced for another cluster.
        BackendUnavailable: the directory cannot be created or opened.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, keys: object = None, cluster_id: str | None = None,
        file_bytes_max: int = FILE_BYTES_MAX_DEFAULT, lock_wait_ms: int = LOCK_WAIT_MS_DEFAULT,
    ) -> None:
        check_keys_given(keys)  # L2: None never means unsigned
        found = getattr(keys, "cluster_id", None) if keys not in (None, UNSIGNED) else None
        cluster = cluster_id if cluster_id is not None else found
        if not isinstance(cluster, str) or not cluster:
            raise InvalidArgument("cluster_id", "required with keys that name no cluster (e.g. 'unsigned')")
        self.cluster_id = cluster
        self.file_bytes_max = validate_int("file_bytes_max", file_bytes_max, 0, VALUE_BYTES_CEILING)
        self.lock_wait_ms = validate_int("lock_wait_ms", lock_wait_ms, 0, LOCK_WAIT_MS_MAX)
        self.fence_rule: FenceRule = decide
        self._verification = Verification()
        self._verification.use_keys(keys, cluster)
        self._tokens = VerifiedTokens(self._verification)
        self._meta_cache: tuple[tuple[int, int, int, int], dict[str, Any]] | None = None
        self._open_scopes: dict[str, fio.OpenScope] = {}
        self._syncer: ThreadPoolExecutor | None = None  # the mark's sync beside the data's (_raise_beside)
        self._late_marks: list[Future[bool]] = []  # the "unordered" control's, waited for at close
        self._scopes_lock = threading.Lock()
        self.path = Path(path)
        self.resource = f"files:{self.path}"
        fio.io(f"cannot create {self.path}", lambda: self.path.mkdir(mode=fio.DIR_MODE, parents=True, exist_ok=True))
        self._root = fio.io(f"cannot open {self.path}", lambda: os.open(
            self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        try:
            with fio.locked(self._root, exclusive=True, wait_ms=self.lock_wait_ms):
                meta = self._meta()
                if meta is None:
                    self._write_meta(0)
                elif meta["cluster_id"] != cluster:
                    raise InvalidArgument("cluster_id", f"{self.path} is fenced for cluster {meta['cluster_id']}")
                elif self._verification.verifies and not meta.get("verified"):  # L2: remembered from now on
                    self._write_meta(int(meta["default_floor"]))
                else:
                    refuse_unsigned_after_signed(str(self.path), bool(meta.get("verified")), keys)
        except BaseException:
            os.close(self._root)
            raise

    # -- the files --------------------------------------------------------------------------------

    def write(self, name: str, data: bytes | str, token: FencingToken | str, *, scope: str | None = None) -> None:
        """Replace ``name`` of the token's scope with ``data``, fenced: one batch of one file.

        Raises:
            StaleToken, TokenMismatch: rejected (nothing written).
            InvalidArgument: a bad token, scope, name or data (nothing written).
            BackendUnavailable: a lock timeout, a full or read-only disk (the old file intact).
        """
        # One file: the batch's steps without its bookkeeping (this is the path the benchmark measures).
        name, data = fio.validate_name(name), self._checked_data(data)
        checked, forged = self._tokens.check(token)
        scope_name = _validate_scope(checked.scope if scope is None else scope)
        opened = self._open_scope(scope_name)
        opened.acquire(self.lock_wait_ms)
        try:
            accepted, own = self._admit(opened, checked, scope_name, forged)
            raising = own is None or accepted > own
            temp = fio.write_temp(opened.fd, data, sync=not raising)
            if raising:
                try:  # the mark durable first (see _raise_beside), while the data's own fsync runs
                    self._raise_beside(opened.fd, accepted, own, temp)
                except BaseException:
                    fio.discard(opened.fd, temp)
                    raise
            try:
                fio.replace(opened.fd, temp, name)
            except OSError as exc:
                fio.discard(opened.fd, temp)
                raise fio.failed(f"cannot replace {name!r}", exc, certain_no_effect=True) from exc
            fio.io(f"cannot sync the directory of {name!r}", lambda: fio.sync_dir(opened.fd), certain_no_effect=False)
        finally:
            opened.release()

    def _raise_beside(self, scope_fd: int, accepted: int, own: int | None, temp: str) -> None:
        """Make the raised mark and the unsynced temporary file ``temp`` durable, both before this returns.

        The mark is overwritten in place and ``fdatasync``'d on a helper thread while this thread fsyncs
        the data (two syncs at once cost about one: 1.06x a plain write, against 1.89x one after the
        other). Only then may the caller rename the data into place: a rename can reach the disk at any
        moment after it is made, so the mark must be on disk before it is. A mark not yet in its
        fixed-width form (none, or an older writer's) is replaced durably instead, before the data's sync.
        If the data's sync fails, the mark is put back (nothing was admitted under it).

        Raises:
            BackendUnavailable: a sync or the mark's write failed (``certain_no_effect``: no data renamed).
        """
        if mark_writes == "replace":  # the control: the mark renamed into place, sequentially (four syncs)
            fio.io("cannot sync a temporary file", lambda: fio.sync_file(scope_fd, temp))
            fio.replace_durably(scope_fd, fio.MARK_NAME, fio.mark_bytes(accepted))
            return
        if own is None:  # no mark file yet: made by a rename (then overwritten in place from the next raise)
            fio.replace_durably(scope_fd, fio.MARK_NAME, fio.mark_bytes(accepted))
            fio.io("cannot sync a temporary file", lambda: fio.sync_file(scope_fd, temp))
            return
        marked = self._helper().submit(fio.overwrite_mark, scope_fd, accepted)
        try:
            fio.io("cannot sync a temporary file", lambda: fio.sync_file(scope_fd, temp))
        except BaseException:
            self._put_back(marked, scope_fd, own)
            raise
        if mark_writes == "unordered":  # the control: the data may be renamed before the mark is on disk
            self._late_marks.append(marked)
            return
        self._mark_written(marked, scope_fd, accepted)

    def _mark_written(self, marked: Future[bool], scope_fd: int, accepted: int) -> None:
        try:
            done = marked.result()
        except OSError as exc:
            raise fio.failed("cannot write a scope's mark", exc, certain_no_effect=True) from exc
        if not done:  # replaced under us by an older writer's rename: the lock excludes that; be safe anyway
            fio.replace_durably(scope_fd, fio.MARK_NAME, fio.mark_bytes(accepted))

    def _put_back(self, marked: Future[bool], scope_fd: int, own: int) -> None:
        try:
            if marked.result():
                fio.overwrite_mark(scope_fd, own)
        except OSError:
            pass  # a mark left raised refuses more, never less

    def _helper(self) -> ThreadPoolExecutor:
        with self._scopes_lock:
            if self._syncer is None:
                # A few workers: one handle's threads writing other scopes do not queue behind one mark's sync.
                self._syncer = ThreadPoolExecutor(SYNC_THREADS_MAX, thread_name_prefix="stockade-files-sync")
            return self._syncer

    def _checked_data(self, data: object) -> bytes:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data", f"must be bytes or str, got {type(data).__name__}")
        if len(data) > self.file_bytes_max:
            raise InvalidArgument("data", f"must be at most {self.file_bytes_max} bytes, got {len(data)}")
        return bytes(data)

    def delete(self, name: str, token: FencingToken | str, *, scope: str | None = None) -> None:
        """Remove ``name`` of the token's scope, fenced (no error if it does not exist)."""
        with self.batch(token, scope=scope) as batch:
            batch.delete(name)

    def read(self, name: str, *, scope: str) -> bytes | None:
        """The current content of ``name`` in ``scope`` (None if missing). Takes no lock.

        Raises:
            BackendUnavailable: a link where the scope or file should be, a file over ``file_bytes_max``.
        """
        scope, name = _validate_scope(scope), fio.validate_name(name)
        try:
            fd, _ = fio.open_dir(scope, self._root, create=False)
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise
        try:
            return fio.read_small(name, fd, self.file_bytes_max)
        finally:
            os.close(fd)

    def names(self, *, scope: str) -> list[str]:
        """The file names of ``scope``, sorted (the fence's own files left out)."""
        scope = _validate_scope(scope)
        try:
            fd, _ = fio.open_dir(scope, self._root, create=False)
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return []
            raise
        try:
            return sorted(n for n in os.listdir(fd) if not n.startswith(fio.RESERVED_PREFIX))
        finally:
            os.close(fd)

    @contextmanager
    def batch(self, token: FencingToken | str, *, scope: str | None = None) -> Iterator[FileBatch]:
        """``with d.batch(token) as b: b.write(...); b.delete(...)``: one fenced batch on one scope.

        The scope's lock is taken and the token checked when the block opens;
        the files are applied when it ends (the mark first); an exception in
        the block applies nothing.

        Raises:
            StaleToken, TokenMismatch: rejected when the block opens (R5: counted, logged).
            InvalidArgument: a bad token or scope.
            BackendUnavailable: a lock timeout or an I/O failure (see `FileBatch`).
        """
        checked, forged = self._tokens.check(token)
        scope_name = _validate_scope(checked.scope if scope is None else scope)
        # The scope's directory exists before its lock is taken and the default floor read: the
        # floor relies on it (see raise_high_waters).
        opened = self._open_scope(scope_name)
        with opened.held(self.lock_wait_ms):
            accepted, own = self._admit(opened, checked, scope_name, forged)
            batch = FileBatch(self, scope_name, opened.fd, accepted, own)
            try:
                yield batch
            except BaseException:
                batch._discard()
                raise
            batch._apply()

    def _admit(
        self, opened: fio.OpenScope, checked: FencingToken, scope: str, forged: str | None
    ) -> tuple[int, int | None]:
        """Check ``checked`` holding the scope's lock: (the mark to keep, the scope's own mark now).

        Raises:
            StaleToken, TokenMismatch: rejected (R5: counted, logged).
        """
        own = self._read_mark(opened)
        new_mark = admit_mark(checked, scope=scope, cluster=self.cluster_id,
                              high_water=effective_mark(own, self._default_floor()), resource=self.resource,
                              rule=self.fence_rule, forged=forged)
        return new_mark, own

    def _open_scope(self, scope: str) -> fio.OpenScope:
        """The scope's directory and lock, kept open by this handle (reopened if the name moved)."""
        with self._scopes_lock:
            opened = self._open_scopes.get(scope)
            if opened is not None and opened.current(self._root):
                return opened
            if opened is not None:
                self._forget(scope)
            if len(self._open_scopes) >= OPEN_SCOPES_MAX:
                for name in list(self._open_scopes):  # close an idle one (one in use is left alone)
                    if self._forget(name):
                        break
            opened = fio.OpenScope(self._root, scope)
            if opened.created:
                fio.io("cannot sync the directory", lambda: fio.sync_dir(self._root))
            self._open_scopes[scope] = opened
            return opened

    def _forget(self, scope: str) -> bool:
        opened = self._open_scopes[scope]
        if not opened.threads.acquire(blocking=False):
            return False
        try:
            del self._open_scopes[scope]
            opened.close()
        finally:
            opened.threads.release()
        return True

    def _read_mark(self, opened: fio.OpenScope) -> int | None:
        # Read every time, never cached by its stat: a raise overwrites the mark in place, keeping its
        # inode and size, and a coarse clock may keep its mtime (another handle's raise would be missed).
        return self._own_mark(opened.fd)

    # -- the marks and the floor (R4) -----------------------------------------------------------------

    def _own_mark(self, scope_fd: int) -> int | None:
        raw = fio.read_small(fio.MARK_NAME, scope_fd, _MARK_BYTES_MAX)
        if raw is None:
            return None
        try:
            return validate_int("high_water", int(raw), 0, TOKEN_VALUE_MAX)
        except (ValueError, InvalidArgument) as exc:
            raise BackendUnavailable(f"{self.path}: a scope's mark is unreadable: {raw!r}") from exc

    def _meta(self) -> dict[str, Any] | None:
        # The file is only ever replaced by a rename (a new inode), so its stat says whether it changed.
        try:
            st = os.stat(fio.META_NAME, dir_fd=self._root, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise fio.failed("cannot stat the fence's file", exc, certain_no_effect=True) from exc
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if self._meta_cache is not None and self._meta_cache[0] == stamp:
            return self._meta_cache[1]
        meta = self._read_meta()
        self._meta_cache = None if meta is None else (stamp, meta)
        return meta

    def _read_meta(self) -> dict[str, Any] | None:
        raw = fio.read_small(fio.META_NAME, self._root, _META_BYTES_MAX)
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
            if meta.get("kind") != _KIND or meta.get("version") != _VERSION:
                raise ValueError(f"kind {meta.get('kind')!r} version {meta.get('version')!r}")
            validate_int("default_floor", meta["default_floor"], 0, TOKEN_VALUE_MAX)
            return dict(meta)
        except (ValueError, KeyError, AttributeError, InvalidArgument) as exc:
            raise BackendUnavailable(f"{self.path}/{fio.META_NAME} is not a fence's file: {exc}") from exc

    def _write_meta(self, default_floor: int) -> None:
        meta = {"kind": _KIND, "version": _VERSION, "cluster_id": self.cluster_id, "default_floor": default_floor,
                "verified": self._verification.verifies or bool((self._meta() or {}).get("verified"))}
        fio.replace_durably(self._root, fio.META_NAME, json.dumps(meta).encode() + b"\n")

    def _default_floor(self) -> int:
        meta = self._meta()
        if meta is None:
            raise BackendUnavailable(f"{self.path}/{fio.META_NAME} is missing")
        return int(meta["default_floor"])

    def _scopes(self) -> list[str]:
        with os.scandir(self._root) as entries:
            return sorted(
                entry.name for entry in entries
                if not entry.name.startswith(fio.RESERVED_PREFIX) and entry.is_dir(follow_symlinks=False)
            )

    def high_water(self, scope: str) -> int:
        """The scope's mark: its own, or the default floor if higher (0 if never written)."""
        scope = _validate_scope(scope)
        try:
            fd, _ = fio.open_dir(scope, self._root, create=False)
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return self._default_floor()
            raise
        try:
            return effective_mark(self._own_mark(fd), self._default_floor())
        finally:
            os.close(fd)

    def default_floor(self) -> int:
        """The durable floor of every scope without a mark of its own (R4)."""
        return self._default_floor()

    def high_waters(self) -> dict[str, int]:
        """Every scope with a mark of its own, with its effective mark (the default floor applied)."""
        default = self._default_floor()
        marks = {}
        for scope in self._scopes():
            fd, _ = fio.open_dir(scope, self._root, create=False)
            try:
                own = self._own_mark(fd)
            finally:
                os.close(fd)
            if own is not None:
                marks[scope] = effective_mark(own, default)
        return marks

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise marks to a floor (R4), never lower one; the named scopes' marks after.

        Floors are serialised with one another by the directory's lock. A named
        scope's mark is raised under that scope's lock (so it waits for an open
        batch). The default floor is written to the fence's file, then every
        scope's lock is taken once: a batch that read the old default floor
        made its scope's directory before that read and holds the lock until
        its last rename, so this returns only after such a batch ended, and
        every later batch reads the new floor. Each mark is replaced durably;
        a crash in the middle leaves some raised, and running it again
        finishes the job.

        Args:
            floors: scope -> floor, or a `FenceFloors` (its ``default`` then joins ``default``).
            default: the durable floor of every scope not named, seen or not.

        Raises:
            InvalidArgument: a bad scope or value (nothing changes).
            BackendUnavailable: a lock timeout or an I/O failure.
        """
        if isinstance(floors, FenceFloors):
            default = max(validate_int("default", default, 0, TOKEN_VALUE_MAX), floors.default)
            floors = floors.floors
        checked = {_validate_scope(scope): value for scope, value in check_floors(floors).items()}
        default = validate_int("default", default, 0, TOKEN_VALUE_MAX)
        with fio.locked(self._root, exclusive=True, wait_ms=self.lock_wait_ms):
            floor = max(self._default_floor(), default)
            own_marks = {}
            for scope, value in sorted(checked.items()):
                fd, created = fio.open_dir(scope, self._root, create=True)
                try:
                    if created:
                        fio.io("cannot sync the directory", lambda: fio.sync_dir(self._root))
                    with fio.locked(fd, exclusive=True, wait_ms=self.lock_wait_ms):
                        own = self._own_mark(fd)
                        if own is None or value > own:
                            fio.replace_durably(fd, fio.MARK_NAME, fio.mark_bytes(value))
                            own = value
                finally:
                    os.close(fd)
                own_marks[scope] = own
            if floor > self._default_floor():
                self._write_meta(floor)
                for scope in self._scopes():  # the barrier: wait out every batch that read the old floor
                    fd, _ = fio.open_dir(scope, self._root, create=False)
                    try:
                        with fio.locked(fd, exclusive=True, wait_ms=self.lock_wait_ms):
                            pass
                    finally:
                        os.close(fd)
        return {scope: effective_mark(own, floor) for scope, own in own_marks.items()}

    def clean(self) -> int:
        """Remove temporary files left by killed writers, in every scope not busy now; how many."""
        removed = 0
        for scope in self._scopes():
            fd, _ = fio.open_dir(scope, self._root, create=False)
            try:
                with fio.locked(fd, exclusive=True, wait_ms=0):
                    removed += fio.remove_temps(fd)
            except BackendUnavailable:
                continue
            finally:
                os.close(fd)
        return removed

    def close(self) -> None:
        for late in self._late_marks:
            late.exception()
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
        with self._scopes_lock:
            for opened in self._open_scopes.values():
                opened.close()
            self._open_scopes.clear()
        os.close(self._root)

    def __enter__(self) -> FencedDirectory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_floor_target(url: str, *, cluster_id: str) -> FencedDirectory:
    """``file:///dir``, a fenced directory, opened for the floor (``stockade floor``; R4).

    The floor verifies no token, so no keys are needed. A missing directory is
    refused, never created: a typo must not make an empty resource that looks floored.

    Raises:
        InvalidArgument: no path, no directory there, or a directory fenced for another cluster.
        BackendUnavailable: the directory cannot be opened.
    """
    path = url.partition("://")[2] if isinstance(url, str) else ""
    if not path or "\x00" in path:
        raise InvalidArgument("resource", "file url needs a directory: file:///path/to/dir")
    if not Path(path).is_dir():
        raise InvalidArgument("resource", f"no directory at {path} (a floor never creates a resource)")
    return FencedDirectory(path, keys=TOKENLESS, cluster_id=cluster_id)
