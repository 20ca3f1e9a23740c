"""``stockade floor sqlite:///path``: a floor target for an SQLite file, whichever kind it is.

The file is either stockade's own store (`SQLiteStore`) or a user's database
fenced by `stockade.resources.sqlite_db`. Which one is read from the file
without changing it, and a missing file is refused rather than created: a
typo in a path must not make a new, empty resource that then looks floored.
"""

from __future__ import annotations

import importlib
import sqlite3
import urllib.parse
from pathlib import Path

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.resources.floor import FloorTarget
from stockade.resources.store._sqlite_files import STORE_KIND
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["open_floor_target"]


def _log_partitions(path: Path) -> int:
    """How many partition files the shard log in this store file spreads over (1: none)."""
    uri = "file:" + urllib.parse.quote("/" + str(path.absolute()).lstrip("/")) + "?mode=ro"
    try:
        view = sqlite3.connect(uri, uri=True)
        try:
            if view.execute("SELECT 1 FROM sqlite_master WHERE name = 'log_layout'").fetchone() is None:
                return 1
            row = view.execute("SELECT v FROM log_layout WHERE k = 'partitions'").fetchone()
            return 1 if row is None else int(row[0])
        finally:
            view.close()
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"cannot read {path} as an SQLite database: {exc}", certain_no_effect=True) from exc


def _is_stockade_store(path: Path) -> bool:
    uri = "file:" + urllib.parse.quote("/" + str(path.absolute()).lstrip("/")) + "?mode=ro"
    try:
        view = sqlite3.connect(uri, uri=True)
        try:
            tables = {r[0] for r in view.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in tables:
                return False
            row = view.execute("SELECT v FROM meta WHERE k = 'kind'").fetchone()
            return row is not None and row[0] == STORE_KIND
        finally:
            view.close()
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"cannot read {path} as an SQLite database: {exc}", certain_no_effect=True) from exc


def open_floor_target(url: str, *, cluster_id: str) -> FloorTarget:
    """Open ``sqlite:///path`` for `stockade.resources.floor.raise_to_floors`.

    Raises:
        InvalidArgument: no path, or no file there.
        BackendUnavailable: the file cannot be read.
    """
    path = sqlite_path(url, "resource")
    if not path.is_file():
        raise InvalidArgument("resource", f"no SQLite file at {path} (a floor never creates a resource)")
    if _is_stockade_store(path):
        from stockade.resources._verify import TOKENLESS
        from stockade.resources.store.sqlite_store import SQLiteStore

        if _log_partitions(path) > 1:  # a shard log spread over partition files: floor every one of them
            from stockade.recipes.log import SQLiteShardLog

            return SQLiteShardLog(path, cluster_id=cluster_id, keys=TOKENLESS)
        return SQLiteStore(path, cluster_id=cluster_id, keys=TOKENLESS)  # refuses another cluster's store
    opened: FloorTarget = importlib.import_module("stockade.resources.sqlite_db").open_floor_target(
        url, cluster_id=cluster_id
    )
    return opened
