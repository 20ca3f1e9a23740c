"""The embedded coordinator's last issued token, read by a store beside it (docs/tokens.md).

A keyring can mint as well as verify, so a MAC alone cannot stop a leaked
keyring from raising a mark to the largest value. Where a store can see its
coordinator's file (``dir/coord.db`` beside ``dir/coord.keys``), it also
refuses a token above the coordinator's last issued one for the scope, as
``stockade serve`` does. The coordinator makes a token durable before it hands
it out (C1), so a token it issued is always at or below what is read here.

`CoordinatorIssued` reads the file through a read-only connection opened for
the read and closed after it (so it holds no file the store's owner would have
to close: a store's lifetime is not tied to its coordinator's), and only when
a token is above the greatest value it has already read for the scope: issued
values only grow, so a remembered one is a valid bound, and a lease's writes
after its first cost no read. It remembers at most `ISSUED_CACHED_MAX` scopes
(then starts over). A server writes its grants first to the record log beside
the file (``coord.log``, `stockade.coordinators.sqlite._log`) and folds them
into the file later: the log's frames of the file's generation are read too.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from urllib.parse import quote

from stockade.core.errors import BackendUnavailable

__all__ = ["CoordinatorIssued", "coordinator_beside", "ISSUED_CACHED_MAX"]

ISSUED_CACHED_MAX = 10_000

_LAST_ISSUED = (
    "SELECT COALESCE((SELECT last_token FROM scopes WHERE scope = ?),"
    " (SELECT CAST(v AS INTEGER) FROM meta WHERE k = 'forgotten_floor'), 0)"
)


def coordinator_beside(keyring: Path) -> Path | None:
    """The embedded coordinator file a keyring belongs to (``x.keys`` -> ``x.db``), if it exists."""
    candidate = keyring.with_suffix(".db")
    return candidate if candidate.is_file() else None


class CoordinatorIssued:
    """``issued(scope, at_least)``: the coordinator file's last issued token of ``scope`` (see the module docstring).

    Args:
        path: the coordinator's SQLite file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CoordinatorIssued({str(self.path)!r})"

    def __call__(self, scope: str, at_least: int = 0) -> int:
        """The last issued token of ``scope`` (read from the file only when ``at_least`` is above what is known).

        Raises:
            BackendUnavailable: the coordinator file cannot be read (the write is refused, never let through).
        """
        with self._lock:
            known = self._known.get(scope, 0)
            if at_least and known >= at_least:
                return known
            try:
                conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True, timeout=5,
                                       isolation_level=None)
                try:
                    value = _last_issued(conn, self.path, scope)
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot read the coordinator's last issued token from {self.path}: {exc}",
                                         certain_no_effect=True) from exc
            if len(self._known) >= ISSUED_CACHED_MAX:
                self._known.clear()
            self._known[scope] = max(known, value)
            return self._known[scope]


def _last_issued(conn: sqlite3.Connection, path: Path, scope: str) -> int:
    """The file's last issued token of ``scope``, with what a server's record log beside it holds beyond the file
    (its acknowledged grants not folded in yet), read in one read transaction (again if a fold raced it)."""
    # The record log, imported only where a store beside a coordinator file reads it.
    from stockade.coordinators.sqlite._log import (  # noqa: PLC0415
        FOLD_RACE_RETRIES,
        generation_moved,
        logged_last_token,
        read_generation,
    )

    for _ in range(FOLD_RACE_RETRIES):
        conn.execute("BEGIN")
        try:
            generation = read_generation(conn)  # the snapshot the rest reads
            value = int(conn.execute(_LAST_ISSUED, (scope,)).fetchone()[0])
            logged = logged_last_token(conn, path, scope)
        finally:
            conn.execute("ROLLBACK")
        if logged is not None and not generation_moved(conn, generation):  # else a fold may have torn the read
            return max(value, logged)
    raise BackendUnavailable(f"the record log beside {path} kept being folded while it was read",
                             certain_no_effect=True)
