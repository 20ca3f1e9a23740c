"""The resources `stockade check` runs against, each behind one seam: `Target`.

A target writes a value under a token and reports what the resource did
(``applied``, ``replayed`` for a retry that an operation id matched, R3, or
``refused`` with the mark, R1), reads a value back with the number of times it
was applied, lists its setup lines, and creates and removes its scratch data.
Every name it writes is derived from the scratch id (``stockade-check-<hex>``
tables and subdirectories, ``stockade-check.<hex>.<case>`` scopes): a scope or
key outside it is refused before anything is sent.

With ``control="fencing-off"`` the same calls write *without* the fence
(stockade's store: the ``fencing-off`` control of `stockade.testing.mutants`;
the others: the data statement alone, as an application that forgot the
fence would), and with ``control="strict-greater"`` through the fence with
``>`` for ``>=`` (where the adapter has that seam): the check must then fail.

Which kind a url opens (`open_target`): ``http(s)://`` stockade's store behind
`stockade serve`; ``sqlite:///path`` an existing file, stockade's own store if
it is one, else the user's SQLite database (fenced by
`stockade.resources.sqlite_db`); ``file:///dir`` a directory;
``postgresql://`` and ``redis://`` in `_targets_net`.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stockade.check import SCRATCH_PREFIX
from stockade.core.errors import AlreadyApplied, InvalidArgument, StaleToken, StockadeError, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.resources.registry import CHECK_TARGETS, load
from stockade.timeline import SetupLine
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["Outcome", "Target", "open_target", "target_class", "CONTROLS", "CASE_CONTROLS", "scratch_scope"]

#: The deliberately broken variants of the resource the check can be run against (docs/check.md, "Controls").
CONTROLS = ("fencing-off", "strict-greater")
#: The controls of a case rather than of the resource: the target is opened unbroken.
CASE_CONTROLS = ("restore-no-floor",)


def scratch_scope(scratch: str, case: str) -> str:
    """The scope of ``case`` under the scratch id: ``stockade-check.<hex>.<case>``."""
    return f"{SCRATCH_PREFIX}.{scratch.rpartition('-')[2]}.{case}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the resource did with one write: ``applied``, ``replayed`` or ``refused`` (with the mark met)."""

    result: str
    mark: int | None = None


class Target:
    """One resource under check. Subclasses fill in `_write`, `_read` and the setup lines.

    Args:
        url: the resource's url.
        scratch: the scratch id (``stockade-check-<hex>``).
        keys: what verifies token MACs (``coord.verify_keys()``).
        cluster_id: the coordinator's cluster.
        control: None, or one of `CONTROLS`.
    """

    kind = "?"
    #: Whether a retry can carry an operation id (R3) and the resource counts applications.
    op_ids = False
    #: The controls this kind can be broken with.
    controls: tuple[str, ...] = ("fencing-off",)

    def __init__(self, url: str, scratch: str, *, keys: object, cluster_id: str, control: str | None = None) -> None:
        if control is not None and control not in self.controls:
            raise InvalidArgument("control", f"{self.kind} can be run with {', '.join(self.controls)}, not {control!r}")
        self.url, self.scratch, self.keys, self.cluster_id, self.control = url, scratch, keys, cluster_id, control

    def _own(self, scope: str) -> str:
        if not scope.startswith(scratch_scope(self.scratch, "")):
            raise InvalidArgument("scope", f"{scope!r} is outside the check's scratch prefix")
        return scope

    def write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        """Write ``value`` at ``key`` of ``scope`` with ``token`` (a retry: the same ``op_id``)."""
        try:
            return self._write(token, self._own(scope), key, value, op_id)
        except AlreadyApplied:
            return Outcome("replayed")
        except StaleToken as exc:
            return Outcome("refused", exc.high_water)
        except TokenMismatch:
            return Outcome("mismatch")

    def read(self, scope: str, key: str) -> tuple[str | None, int]:
        """The value at ``key`` and how many times a write was applied to it (-1: not counted)."""
        return self._read(self._own(scope), key)

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        raise NotImplementedError

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        raise NotImplementedError

    def setup_lines(self) -> list[SetupLine]:
        """The resource's preconditions, each with a verdict (``ok``, ``warn``, ``FAIL``)."""
        return []

    def create_scratch(self) -> None:
        """Create the scratch data the writes need (a table, a directory); nothing when it is there."""

    def floor_url(self) -> str:
        """The url `stockade.resources.floor.open_floor_target` opens to raise this resource's marks."""
        return self.url

    def own_backup(self) -> Path | None:
        """What the check can back up and restore itself, within its scratch area (a directory), or None."""
        return None

    def remove_scratch(self, scopes: list[str]) -> None:
        """Remove what `create_scratch` and the writes left (the marks stay: docs/check.md)."""

    def close(self) -> None:
        """Release connections."""


def _mutant_wrap(name: str, adapter: Any) -> Any:
    """Break ``adapter`` with the control ``name`` (imported by name: the package never imports `testing`)."""
    mutants = importlib.import_module("stockade.testing.mutants")
    return mutants.mutant(name).wrap(adapter)


def _counted_table(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(f'CREATE TABLE IF NOT EXISTS "{table}" (scope TEXT NOT NULL, key TEXT NOT NULL, value TEXT, '
                 "n INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (scope, key))")


_UPSERT = ('INSERT INTO "{table}" (scope, key, value, n) VALUES (?, ?, ?, 1) ON CONFLICT (scope, key) '
           "DO UPDATE SET value = excluded.value, n = n + 1")


class StoreTarget(Target):
    """stockade's own fenced store, embedded (``sqlite:///store.db``) or behind `stockade serve` (``http://``)."""

    kind = "store"
    op_ids = True
    controls = ("fencing-off", "strict-greater")

    def __init__(self, url: str, scratch: str, **options: Any) -> None:
        super().__init__(url, scratch, **options)
        self.remote = url.startswith(("http://", "https://"))
        if self.control is not None and self.remote:
            raise InvalidArgument("control", "a store behind stockade serve enforces the fence itself: run the "
                                             "control on an embedded store (sqlite:///.../store.db)")
        import stockade

        if self.control is None:
            if self.remote:  # the server verifies with its own keys
                self.store: Any = stockade.open_store(url, cluster_id=self.cluster_id)
            else:
                self.store = stockade.open_store(url, cluster_id=self.cluster_id, keys=self.keys)
        else:
            mutants = importlib.import_module("stockade.testing.mutants")
            store_class = mutants.mutant(self.control).sqlite_class
            self.store = store_class(sqlite_path(url, "resource"), cluster_id=self.cluster_id, keys=self.keys)

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        result = self.store.put(scope, key, value, token=token, idempotency_key=op_id)
        return Outcome("replayed" if result.replayed else "applied", result.high_water)

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        item = self.store.get(scope, key)
        return (None if item is None else item.value.decode()), -1

    def remove_scratch(self, scopes: list[str]) -> None:
        pass  # the store's keys are deleted under a lease by the orchestrator (`cleanup_store`)

    def setup_lines(self) -> list[SetupLine]:
        if self.remote:
            return []
        return [keyring_line(sqlite_path(self.url, "resource").parent, self.cluster_id, discovery=True)]

    def close(self) -> None:
        self.store.close()


class SQLiteDbTarget(Target):
    """The user's own SQLite database, fenced by `stockade.resources.sqlite_db` (a scratch table)."""

    kind = "sqlite"
    op_ids = True
    controls = ("fencing-off", "strict-greater")

    def __init__(self, url: str, scratch: str, **options: Any) -> None:
        super().__init__(url, scratch, **options)
        from stockade.resources.sqlite_db import SQLiteFence

        self.path = sqlite_path(url, "resource")
        self.table = scratch.replace("-", "_")
        self.fence = SQLiteFence(self.path, keys=self.keys, cluster_id=self.cluster_id)
        if self.control is not None:
            _mutant_wrap(self.control, self.fence)

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        conn = self.fence.connection
        if self.control == "fencing-off":  # the application that forgot the fence: the statement alone
            conn.execute(_UPSERT.format(table=self.table), (scope, key, value))
            return Outcome("applied")
        with self.fence.fenced(token, scope=scope, op_id=op_id):
            conn.execute(_UPSERT.format(table=self.table), (scope, key, value))
        return Outcome("applied", self.fence.high_water(scope))

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        row = self.fence.connection.execute(f'SELECT value, n FROM "{self.table}" WHERE scope = ? AND key = ?',
                                            (scope, key)).fetchone()
        return (None, 0) if row is None else (row[0], int(row[1]))

    def create_scratch(self) -> None:
        _counted_table(self.fence.connection, self.table)

    def remove_scratch(self, scopes: list[str]) -> None:
        self.fence.connection.execute(f'DROP TABLE IF EXISTS "{self.table}"')

    def setup_lines(self) -> list[SetupLine]:
        conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True, timeout=5)
        try:
            journal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            synchronous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
        finally:
            conn.close()
        names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        lines = [
            SetupLine("journal mode", journal, "FAIL" if journal in ("off", "memory") else "ok"),
            SetupLine("synchronous (a new connection's default)", names.get(synchronous, str(synchronous)),
                      "ok" if synchronous >= 2 else ("warn" if synchronous == 1 and journal == "wal" else "FAIL")),
            SetupLine("a writer frozen inside its transaction",
                      "holds the file's write lock until it resumes or dies; SQLite cannot end another process's "
                      "transaction: newer tokens wait up to their busy timeout (safe, not live)", "warn"),
        ]
        return lines + [filesystem_line(self.path.parent),
                        keyring_line(self.path.parent, self.cluster_id, discovery=False)]

    def close(self) -> None:
        self.fence.close()


class FilesTarget(Target):
    """A directory fenced by `stockade.resources.files`: the check fences a scratch subdirectory of it."""

    kind = "files"
    controls = ("fencing-off", "strict-greater")

    def __init__(self, url: str, scratch: str, **options: Any) -> None:
        super().__init__(url, scratch, **options)
        from stockade.resources.files import FencedDirectory

        self.parent = Path(url.partition("://")[2])
        self.root = self.parent / scratch
        self.fence = FencedDirectory(self.root, keys=self.keys, cluster_id=self.cluster_id)
        if self.control is not None:
            _mutant_wrap(self.control, self.fence)

    def _write(self, token: FencingToken, scope: str, key: str, value: str, op_id: str | None) -> Outcome:
        if self.control == "fencing-off":  # a plain file write, as an application that forgot the fence would
            (self.root / scope).mkdir(exist_ok=True)
            (self.root / scope / key).write_text(value)
            return Outcome("applied")
        self.fence.write(key, value, token, scope=scope)
        return Outcome("applied", self.fence.high_water(scope))

    def _read(self, scope: str, key: str) -> tuple[str | None, int]:
        data = self.fence.read(key, scope=scope)
        return (None if data is None else data.decode()), -1

    def remove_scratch(self, scopes: list[str]) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.root.with_name(self.root.name + ".backup"), ignore_errors=True)

    def floor_url(self) -> str:
        return f"file://{self.root}"  # the scratch subdirectory is the fenced directory

    def own_backup(self) -> Path | None:
        return self.root

    def setup_lines(self) -> list[SetupLine]:
        return [filesystem_line(self.root), fsync_line(self.root),
                keyring_line(self.parent, self.cluster_id, discovery=False)]

    def close(self) -> None:
        self.fence.close()


_NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs", "afs")


def filesystem_line(path: Path) -> SetupLine:
    """Which filesystem ``path`` is on (/proc/mounts); a network one cannot keep the fence's locks (FAIL)."""
    target, best, fstype = str(path.resolve()), "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")):
                    if len(fields[1]) >= len(best):
                        best, fstype = fields[1], fields[2]
    except OSError:
        return SetupLine("filesystem", "unknown (/proc/mounts unreadable)", "warn")
    verdict = "FAIL" if fstype in _NETWORK_FILESYSTEMS or fstype.startswith("fuse") else "ok"
    return SetupLine("filesystem", f"{fstype} at {best or '?'}", verdict)


def keyring_line(directory: Path, cluster_id: str, *, discovery: bool) -> SetupLine:
    """The keyrings beside the data (``*.keys*`` files of ``directory`` that parse as one): a copy readable by
    group or others lets whoever reads it mint tokens (FAIL); several copies of the cluster's keyring (a backup
    beside the original) are a secret kept twice that a rotation does not reach, and, with ``discovery`` (a
    store opened without ``keys=``), a store that refuses to open (L2: docs/tokens.md) (warn)."""
    from stockade.keys import find_keyring, load_keyring

    name = "keyrings beside the data"
    try:
        candidates = sorted(p for p in directory.iterdir() if ".keys" in p.name and p.is_file())[:256]
    except OSError as exc:
        return SetupLine(name, f"unreadable ({exc.strerror})", "warn")
    ours, exposed = [], []
    for path in candidates:
        try:
            owner = load_keyring(path).cluster_id
        except StockadeError:
            continue
        mode = path.stat().st_mode & 0o777
        if owner == cluster_id:
            ours.append(path.name)
        if mode & 0o077:
            exposed.append(f"{path.name} (mode {mode:04o})")
    if exposed:
        return SetupLine(name, f"{', '.join(exposed)} readable by others: whoever reads a keyring mints tokens "
                               "(keep it 0600; rotate with grace_s=0 if it leaked)", "FAIL")
    if len(ours) > 1:
        found = f"{len(ours)} keyrings of cluster {cluster_id}: {', '.join(ours)} (a copy beside the original: " \
                "a rotation reaches only the file the coordinator signs with)"
        if discovery:
            try:
                find_keyring(directory, cluster_id)
            except InvalidArgument:
                found += "; a store opened without keys= refuses to open (L2): pass keys= or move the copy away"
        return SetupLine(name, found, "warn")
    return SetupLine(name, ours[0] if ours else "none (the resource is given its keys)", "ok")


def fsync_line(directory: Path) -> SetupLine:
    """Whether a file and its directory can be fsync'd there (the fence's durability needs both)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".stockade-check-fsync-", dir=directory)
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        return SetupLine("fsync of a file and its directory", f"failed: {exc.strerror or exc}", "FAIL")
    return SetupLine("fsync of a file and its directory", "works", "ok")


def _has_table(path: Path, name: str) -> bool:
    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() \
            is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _is_stockade_store(path: Path) -> bool:
    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
        return row is not None and conn.execute("SELECT 1 FROM meta WHERE k = 'cluster_id'").fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def target_class(url: str) -> type[Target]:
    """The kind of resource ``url`` names, after checking that it exists (the check never creates one).

    Raises:
        InvalidArgument: not a url, an unknown scheme, or a path that is not there.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not rest:
        raise InvalidArgument("resource", f"{url!r} is not a url (e.g. postgresql://host/db, sqlite:///path/app.db, "
                                          "redis://host:6379/0, file:///dir, http://host:7390)")
    entry = CHECK_TARGETS.get(scheme)
    if entry is None:
        raise InvalidArgument("resource", f"unknown scheme {scheme!r}; supported: {', '.join(sorted(CHECK_TARGETS))}")
    found: type[Target] = load(entry)(rest)  # imported on use: the network kinds' drivers are optional
    return found


def store_target(rest: str) -> type[Target]:
    """A `stockade serve`'s store (its checks happen when it is opened)."""
    return StoreTarget


def sqlite_target(rest: str) -> type[Target]:
    """A stockade store file, or the user's own database with the fence installed."""
    path = sqlite_path(rest, "resource")
    if not path.is_file():
        raise InvalidArgument("resource", f"{path}: no such SQLite file (the check never creates the resource)")
    if _is_stockade_store(path):
        return StoreTarget
    if not _has_table(path, "stockade_fence"):
        raise InvalidArgument("resource", f"{path}: the fence is not installed in this database (run "
                                          "stockade.resources.sqlite_db.install); the check installs nothing")
    return SQLiteDbTarget


def files_target(rest: str) -> type[Target]:
    """A directory fenced by the files adapter."""
    if not Path(rest).is_dir():
        raise InvalidArgument("resource", f"{rest}: no such directory (the check never creates the resource)")
    return FilesTarget


def open_target(url: str, scratch: str, *, coord: Any, control: str | None = None) -> Target:
    """The `Target` for ``url`` (see `target_class`), trusting the tokens of the coordinator ``coord``.

    The verification keys are fetched from ``coord`` except for a store behind
    `stockade serve`, which verifies with its own (a server gives its keys only
    to an administrator's token).
    """
    if control in CASE_CONTROLS:
        control = None
    remote_store = url.startswith(("http://", "https://"))
    keys = None if remote_store else coord.verify_keys()
    return target_class(url)(url, scratch, keys=keys, cluster_id=coord.cluster_id, control=control)
