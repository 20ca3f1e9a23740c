"""The coordinator file on disk: what it is, how it is created, and which clock its times are on.

Read-only checks made before a coordinator opens a path (`inspect_coordinator_path`:
a directory, a device, a non-SQLite file, a store file or a foreign database
is refused untouched), creation with mode 0600, and the boot id and
monotonic-clock offset that tell whether this process reads the file's lease
deadlines on the same clock as the processes that wrote them.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import time
import urllib.parse
from pathlib import Path

from stockade.core.errors import BackendUnavailable, WrongFileKind

__all__ = [
    "APPLICATION_ID", "STORE_APPLICATION_ID", "KIND", "TIMENS_OFFSETS", "boot_id", "monotonic_offset_ns",
    "classify", "inspect_coordinator_path", "create_private", "private_sidecars",
    "claim_lock_file", "drop_lock_file", "claim_is_alone",
]

#: ``PRAGMA application_id`` of a coordinator file ("STKC").
APPLICATION_ID = 0x53544B43
#: ``PRAGMA application_id`` a stockade store file may carry ("STKS"); refused here.
STORE_APPLICATION_ID = 0x53544B53
KIND = "coordinator"
_COORDINATOR_TABLES = frozenset({"meta", "scopes", "leases", "waiters"})
# The tables of an unmarked coordinator file: schema version 1 (leases in their own table), or 2.
_COORDINATOR_LAYOUTS = (_COORDINATOR_TABLES, _COORDINATOR_TABLES - {"leases"})
_STORE_TABLES = frozenset({"hwm", "kv", "audit", "idempotency", "counters"})
_JOURNAL_TABLES = frozenset({"history", "history_recent", "sqlite_sequence"})  # the journal (docs/history.md)
CLAIM_RETRY_S = 0.05  # how long a refused shared claim is retried (another opener checking it is alone)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


TIMENS_OFFSETS = "/proc/self/timens_offsets"


def monotonic_offset_ns(offsets_path: str | os.PathLike[str] = TIMENS_OFFSETS) -> int:
    """How far this process's monotonic clock is moved from the host's (its time namespace), in ns.

    Read from ``/proc/self/timens_offsets`` (Linux 5.6+); 0 where there are no
    time namespaces (the file is missing or unreadable).
    """
    try:
        text = Path(offsets_path).read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] in ("monotonic", "1"):  # CLOCK_MONOTONIC is clock id 1
            try:
                return int(fields[1]) * 1_000_000_000 + int(fields[2])
            except ValueError:
                return 0
    return 0


def classify(application_id: int, tables: set[str], meta: dict[str, str]) -> str | None:
    """None when a database may be used as a coordinator file, else what it is, in words.

    A coordinator carries `APPLICATION_ID`; an empty database (no tables) may
    become one; a file of an earlier version (the coordinator tables, no
    application id) is adopted.
    """
    if application_id == APPLICATION_ID:
        return None if meta.get("kind", KIND) == KIND else f"a {meta['kind']} file"
    if application_id == STORE_APPLICATION_ID or tables & _STORE_TABLES:
        return "a stockade store file"
    if application_id != 0:
        return f"a foreign SQLite database (application_id {application_id:#010x})"
    if not tables:
        return None
    if tables - _JOURNAL_TABLES in _COORDINATOR_LAYOUTS and (not meta or "cluster_id" in meta):
        return None
    return "a foreign SQLite database"


_SQLITE_HEADER = b"SQLite format 3\x00"


def inspect_coordinator_path(path: Path) -> bool:
    """Check, reading only, that ``path`` may be opened as a coordinator; returns whether it exists.

    Raises:
        WrongFileKind: a directory, a device or other non-regular file, a file
            that is not SQLite, or an SQLite database that is not a
            coordinator's. Nothing was created or changed.
        BackendUnavailable: it cannot be read.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise BackendUnavailable(f"cannot open coordinator file {path}: {exc}", certain_no_effect=True) from exc
    if stat.S_ISDIR(st.st_mode):
        raise WrongFileKind(str(path), "coordinator", "a directory")
    if not stat.S_ISREG(st.st_mode):
        raise WrongFileKind(str(path), "coordinator", "not a regular file (a device, a pipe or a socket)")
    if st.st_size == 0:
        return True  # an empty file becomes a coordinator
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise BackendUnavailable(f"cannot open coordinator file {path}: {exc}", certain_no_effect=True) from exc
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise WrongFileKind(str(path), "coordinator", "not an SQLite database")
    application_id = int.from_bytes(header[68:72], "big", signed=True)
    if application_id == APPLICATION_ID:
        return True
    # No marker in the main file: look at its tables through a read-only view.
    # A file with a live writer keeps its newest pages (the marker too) in its
    # -wal: read through it, which needs -wal and -shm and creates neither.
    # Otherwise an immutable view: no locks taken, no side file created.
    live = os.path.exists(f"{path}-wal") and os.path.exists(f"{path}-shm")
    # One leading slash: "file://x/..." would name a host x ("sqlite:////abs/path" gives "//abs/path").
    absolute = "/" + str(path.absolute()).lstrip("/")
    uri = "file:" + urllib.parse.quote(absolute) + ("?mode=ro" if live else "?mode=ro&immutable=1")
    try:
        view = sqlite3.connect(uri, uri=True)
        try:
            application_id = view.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in view.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            meta = dict(view.execute("SELECT k, v FROM meta").fetchall()) if "meta" in tables else {}
        finally:
            view.close()
    except sqlite3.Error:
        raise WrongFileKind(str(path), "coordinator", "not a readable SQLite database") from None
    if application_id == APPLICATION_ID:
        return True
    found = classify(application_id, tables, meta)
    if found is not None:
        raise WrongFileKind(str(path), "coordinator", found)
    return True


def create_private(path: Path) -> None:
    """Create an empty coordinator file, mode 0600 whatever the umask (an existing one is left alone)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        inspect_coordinator_path(path)  # another opener made it meanwhile: check it again
        return
    except OSError as exc:
        raise BackendUnavailable(f"cannot create coordinator file {path}: {exc}", certain_no_effect=True) from exc
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def private_sidecars(path: Path) -> None:
    """Give ``-wal`` and ``-shm`` no more permissions than the database file itself."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    for suffix in ("-wal", "-shm"):
        try:
            side = os.stat(f"{path}{suffix}")
            if stat.S_IMODE(side.st_mode) & ~mode and side.st_uid == os.geteuid():
                os.chmod(f"{path}{suffix}", stat.S_IMODE(side.st_mode) & mode)
        except OSError:
            pass


def claim_lock_file(path: Path, exclusive: bool) -> tuple[int, bool, bool]:
    """Hold ``PATH.lock``: shared by embedded users, exclusive for a server.

    Returns:
        ``(fd, created, alone)``: the claim (closing it releases it), whether
        this call created the lock file, and whether nobody else had the file
        open at that moment (always true for an exclusive claim).

    Raises:
        BackendUnavailable: held by the other kind of user, or cannot be opened.
    """
    lock_path = f"{path}.lock"
    created = False
    try:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            created = True
            os.fchmod(fd, 0o600)
        except FileExistsError:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise BackendUnavailable(f"cannot open coordinator file {path}: {exc}") from exc
    try:
        if exclusive:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        else:
            alone = _claim_shared(fd)
    except OSError:
        os.close(fd)
        if exclusive:
            held_by_host = os.path.exists(f"{path}.sock")  # the default url's host process (coordinators/sqlite/_host)
            raise BackendUnavailable(
                f"{path} is open in other processes; a server must be its only user"
                + (" (its host process, which sqlite:///… urls start, has it: it exits after 30 s with no lease, "
                   "waiter or connection)" if held_by_host else ""),
                certain_no_effect=True,
            ) from None
        raise BackendUnavailable(
            f"{path} is served by a running stockade server; connect to the server over http:// instead "
            f"(or, if it is the host process of the file, with sqlite:///… without ?process=embedded)",
            certain_no_effect=True,
        ) from None
    return fd, created, alone


def _claim_shared(fd: int) -> bool:
    """Take the shared claim; returns whether nobody else had the file open at that moment.

    Being alone is tried first (an exclusive claim, turned shared at once).
    Another opener doing the same holds it exclusively for a moment, so a
    refused shared claim is retried briefly before it means a server.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    else:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # raises if a server took it in between
        return True
    give_up = time.monotonic() + CLAIM_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.001)


def drop_lock_file(path: Path, fd: int, remove: bool) -> None:
    """Release the claim ``fd``; remove ``PATH.lock`` too when asked and nobody else holds it."""
    if fd < 0:
        return
    try:
        if remove:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(f"{path}.lock")
            except OSError:
                pass
    finally:
        os.close(fd)


def claim_is_alone(fd: int) -> bool:
    """Whether no other process has the file open (an embedded claim is upgraded for a moment)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        pass  # keeps the exclusive claim: nobody else may open meanwhile, which is safe
    return True
