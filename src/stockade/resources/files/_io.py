"""The POSIX steps a fenced directory is made of: names, locks with a deadline, durable atomic replacement.

Everything here works relative to an open directory descriptor (``dir_fd``)
and opens with ``O_NOFOLLOW``, so no path is ever resolved through ``.``,
``..`` or a symbolic link planted in the tree. `OSError` becomes
`BackendUnavailable` at this edge (a full or read-only disk, a permission, a
link where a directory should be).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from stockade.core.errors import BackendUnavailable, InvalidArgument

__all__: list[str] = []  # private to stockade.resources.files

RESERVED_PREFIX = ".stockade-"  # the directory's own files; refused as user names and scopes
TMP_PREFIX = ".stockade-tmp-"
LOCK_NAME = ".stockade-lock"
MARK_NAME = ".stockade-high-water"
META_NAME = ".stockade-fence"
# A mark is written as 20 zero-padded digits and a newline: every value up to 2**63-1 has the same length,
# so a raise overwrites the same 21 bytes of the file's first sector in place (`overwrite_mark`).
MARK_BYTES = 21
NAME_BYTES_MAX = 255  # a file name on the common local filesystems (NAME_MAX)
FILE_MODE = 0o600
DIR_MODE = 0o700
_POLL_S_MAX = 0.002  # the longest sleep between two tries of a busy lock
_TEMP_TRIES = 100
_serial = itertools.count()  # next() on it is atomic under the GIL
_pid = [os.getpid()]  # a system call saved per write; a forked child learns its own
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))

T = TypeVar("T")


def validate_name(name: object) -> str:
    """A file name inside a scope: 1..255 UTF-8 bytes, no ``/`` or NUL, not ``.``/``..``, not ``.stockade-*``.

    Raises:
        InvalidArgument: anything else.
    """
    if not isinstance(name, str):
        raise InvalidArgument("name", f"must be a string, got {type(name).__name__}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("name", "must be valid UTF-8 (no lone surrogates)") from None
    if not 1 <= size <= NAME_BYTES_MAX:
        raise InvalidArgument("name", f"must be 1..{NAME_BYTES_MAX} bytes, got {size}")
    if "/" in name or "\x00" in name:
        raise InvalidArgument("name", "must not contain '/' or NUL (one name, not a path)")
    if name in (".", ".."):
        raise InvalidArgument("name", f"must not be {name!r} (a path step, not a name)")
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArgument("name", f"names starting with {RESERVED_PREFIX!r} are the fence's own")
    return name


def failed(what: str, exc: OSError, *, certain_no_effect: bool) -> BackendUnavailable:
    """The typed error for an I/O failure (ENOSPC, EROFS, EACCES, ELOOP, ...)."""
    reason = errno.errorcode.get(exc.errno or 0, "error")
    return BackendUnavailable(f"{what}: {reason}: {exc.strerror or exc}", certain_no_effect=certain_no_effect)


def io(what: str, step: Callable[[], T], *, certain_no_effect: bool = True) -> T:
    try:
        return step()
    except OSError as exc:
        raise failed(what, exc, certain_no_effect=certain_no_effect) from exc


def open_dir(name: str, dir_fd: int, *, create: bool) -> tuple[int, bool]:
    """Open (creating if asked and missing) the directory ``name`` under ``dir_fd``, refusing a link; (fd, created).

    Raises:
        BackendUnavailable: a link or a file where the directory should be, or an I/O failure
            (``__cause__`` is the `FileNotFoundError` when it is missing and ``create`` is false).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    created = False
    try:
        return os.open(name, flags, dir_fd=dir_fd), False
    except FileNotFoundError as exc:
        if not create:
            raise failed(f"no directory {name!r}", exc, certain_no_effect=True) from exc
    except OSError as exc:
        raise _not_a_directory(name, exc) from exc
    try:
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        pass  # another writer made it meanwhile
    except OSError as exc:
        raise failed(f"cannot create directory {name!r}", exc, certain_no_effect=True) from exc
    try:
        return os.open(name, flags, dir_fd=dir_fd), created
    except OSError as exc:
        raise _not_a_directory(name, exc) from exc


def _not_a_directory(name: str, exc: OSError) -> BackendUnavailable:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return BackendUnavailable(
            f"{name!r} is a symbolic link or not a directory: a fenced directory never follows one",
            certain_no_effect=True)
    return failed(f"cannot open directory {name!r}", exc, certain_no_effect=True)


def flock(fd: int, *, exclusive: bool, wait_ms: int) -> None:
    """Take ``flock`` on ``fd`` (shared or exclusive), waiting at most ``wait_ms``.

    ``flock`` locks belong to an open file description, so two threads of one
    process, each with its own descriptor, exclude each other like two
    processes do. The lock is tried, then retried with short sleeps until
    ``wait_ms`` passed (a blocking ``flock`` has no deadline).

    Raises:
        BackendUnavailable: still held by another after ``wait_ms`` (nothing happened), or I/O failed.
    """
    operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + wait_ms / 1000
    pause = 0.0001
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackendUnavailable(
                    f"the fence lock is still held after {wait_ms} ms", certain_no_effect=True) from None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _POLL_S_MAX)
        except OSError as exc:
            raise failed("cannot lock", exc, certain_no_effect=True) from exc


def open_lock(dir_fd: int) -> int:
    """Open (creating) ``.stockade-lock`` in ``dir_fd``."""
    return io("cannot open the lock file", lambda: os.open(
        LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd))


@contextmanager
def locked(dir_fd: int, *, exclusive: bool, wait_ms: int) -> Iterator[None]:
    """Hold ``.stockade-lock`` in ``dir_fd`` (see `flock`) for the block, with a descriptor of its own."""
    fd = open_lock(dir_fd)
    try:
        flock(fd, exclusive=exclusive, wait_ms=wait_ms)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


class OpenScope:
    """A scope's directory and lock file kept open by one `FencedDirectory` handle, for its batches.

    Opening them for every batch costs four system calls; a handle keeps them
    and checks with one ``stat`` that the name still leads to the same
    directory (a restore may have replaced it). Threads of one handle share
    the lock file's descriptor, on which ``flock`` does not exclude them, so a
    thread lock comes first.
    """

    def __init__(self, root_fd: int, name: str) -> None:
        self.name = name
        self.fd, self.created = open_dir(name, root_fd, create=True)
        try:
            st = os.fstat(self.fd)
            self.identity = (st.st_dev, st.st_ino)
            self.lock_fd = open_lock(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self.threads = threading.Lock()

    def current(self, root_fd: int) -> bool:
        """Whether ``name`` still leads to this directory."""
        try:
            st = os.stat(self.name, dir_fd=root_fd, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def acquire(self, wait_ms: int) -> None:
        """Take the scope's lock, across this handle's threads and every other descriptor (other processes).

        Raises:
            BackendUnavailable: not free within ``wait_ms`` (nothing held).
        """
        if not self.threads.acquire(timeout=wait_ms / 1000):
            raise BackendUnavailable(f"the fence lock is still held after {wait_ms} ms", certain_no_effect=True)
        try:
            flock(self.lock_fd, exclusive=True, wait_ms=wait_ms)
        except BaseException:
            self.threads.release()
            raise

    def release(self) -> None:
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()

    @contextmanager
    def held(self, wait_ms: int) -> Iterator[None]:
        """`acquire` ... `release` around the block."""
        self.acquire(wait_ms)
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        os.close(self.lock_fd)
        os.close(self.fd)


def read_small(name: str, dir_fd: int, bytes_max: int) -> bytes | None:
    """The whole of file ``name`` (None if missing), refusing a link and anything over ``bytes_max``.

    Raises:
        BackendUnavailable: a link, a file over the bound, or an I/O failure.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BackendUnavailable(f"{name!r} is a symbolic link: a fenced directory never follows one",
                                     certain_no_effect=True) from exc
        raise failed(f"cannot open {name!r}", exc, certain_no_effect=True) from exc
    try:
        if bytes_max < 4096:  # a mark or the meta file: one read says all (a short read of a regular file is EOF)
            data = os.read(fd, bytes_max + 1)
            if len(data) > bytes_max:
                raise BackendUnavailable(f"{name!r} is larger than {bytes_max} bytes", certain_no_effect=True)
            return data
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > bytes_max:
                raise BackendUnavailable(f"{name!r} is larger than {bytes_max} bytes", certain_no_effect=True)
            chunks.append(chunk)
    except OSError as exc:
        raise failed(f"cannot read {name!r}", exc, certain_no_effect=True) from exc
    finally:
        os.close(fd)


def mark_bytes(value: int) -> bytes:
    """A mark's file content: `MARK_BYTES` bytes whatever the value (older writers wrote ``b"%d\n"``)."""
    return b"%020d\n" % value


def overwrite_mark(dir_fd: int, value: int) -> bool:
    """Write ``value`` over the mark file in place and ``fdatasync`` it; False (nothing written) if the file is
    missing or not `MARK_BYTES` long (then the caller replaces it: `replace_durably`).

    One synchronous write, no directory entry changed: the mark is durable when this returns. The write
    keeps the file's size and lands in its first 512-byte sector, which a disk writes whole or not at all
    (the assumption PostgreSQL makes of its pg_control file), so a power loss leaves the old mark or the
    new one. A file of another length is never overwritten: a size that did not reach the disk with the
    new bytes could read back as a lower number.

    Raises:
        OSError: the write or the sync failed (the caller translates it).
    """
    try:
        fd = os.open(MARK_NAME, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != MARK_BYTES:
            return False
        if os.pwrite(fd, mark_bytes(value), 0) != MARK_BYTES:
            raise OSError(errno.EIO, "short write of the mark")
        os.fdatasync(fd)
        return True
    finally:
        os.close(fd)


def sync_file(dir_fd: int, name: str) -> None:
    """fsync file ``name`` of ``dir_fd`` (a temporary file written with ``sync=False``).

    Raises:
        OSError: the open or the sync failed.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(dir_fd: int, data: bytes, *, sync: bool = True) -> str:
    """A new temporary file in ``dir_fd`` holding ``data``, fsync'd (unless ``sync=False``: the caller
    syncs it, `sync_file`); its name. Removed again on failure.

    Raises:
        BackendUnavailable: disk full, read-only, no permission (nothing is left behind).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_TRIES):
        # pid and a counter: unique among live writers; a dead writer's leftover with a reused pid is skipped.
        name = f"{TMP_PREFIX}{_pid[0]}-{next(_serial)}"
        try:
            fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise failed("cannot create a temporary file", exc, certain_no_effect=True) from exc
    else:
        raise BackendUnavailable("cannot find a free temporary file name", certain_no_effect=True)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    except OSError as exc:
        discard(dir_fd, name)
        raise failed("cannot write a temporary file", exc, certain_no_effect=True) from exc
    finally:
        os.close(fd)
    return name


def discard(dir_fd: int, name: str) -> None:
    """Remove a temporary file if it is there (best effort: a leftover is harmless and cleaned later)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def replace(dir_fd: int, temp: str, name: str) -> None:
    """Rename ``temp`` over ``name`` in one directory (atomic on a local POSIX filesystem)."""
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def sync_dir(dir_fd: int) -> None:
    """Make the directory's entries (renames, creations, removals) durable."""
    os.fsync(dir_fd)


def replace_durably(dir_fd: int, name: str, data: bytes) -> None:
    """temp, write, fsync, rename over ``name``, fsync the directory: ``name`` is old or new, never torn.

    Raises:
        BackendUnavailable: the write failed (the old file is intact) or the directory sync failed.
    """
    temp = write_temp(dir_fd, data)
    try:
        replace(dir_fd, temp, name)
    except OSError as exc:
        discard(dir_fd, temp)
        raise failed(f"cannot replace {name!r}", exc, certain_no_effect=True) from exc
    io(f"cannot sync the directory of {name!r}", lambda: sync_dir(dir_fd), certain_no_effect=False)


def remove_temps(dir_fd: int) -> int:
    """Remove the temporary files a killed writer left in ``dir_fd`` (call holding its lock); how many."""
    removed = 0
    for entry in os.listdir(dir_fd):
        if entry.startswith(TMP_PREFIX):
            discard(dir_fd, entry)
            removed += 1
    return removed
