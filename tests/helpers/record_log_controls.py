"""`stockade serve` with its record log's protections off: the controls of tests/test_serve_record_log_attacks.py.

Usage: ``python record_log_controls.py CONTROL[,CONTROL...] [serve args...]``. Each control patches one rule:

- ``folds-every-20`` (not broken: a setting): the log is folded every 20 changes, so a test meets folds quickly.
- ``log-follows-links``: the log is opened as before the fix: a symbolic link at ``coord.log`` is followed and
  whatever it names is zero-filled and written from offset 0 (``ln -s coord.db coord.log`` destroys the file).
- ``log-stays-astray``: a fold never notices that ``coord.log`` was deleted or replaced under the running server,
  so every later frame goes to a file no opener reads and a kill -9 loses what it acknowledged.
- ``epochs-off``: an opener starts no new token epoch (a restored older file goes on from its own last tokens).
- ``stop-in-fold`` / ``stop-after-fold`` (not broken: a place to be stopped): the server stops itself (SIGSTOP) in
  its second fold, inside the transaction before its COMMIT, or right after the COMMIT (before the log's next
  generation is written), so that a test can read the files and kill -9 it exactly there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import stockade.coordinators.sqlite as sqlite_package
from stockade.cli import serve
from stockade.coordinators.sqlite import SQLiteRecords, _log

original_open_log = SQLiteRecords.open_log


def open_log_folding_every_20(self: SQLiteRecords, **options: Any) -> _log.RecordLog:
    return original_open_log(self, **{**options, "fold_changes": 20})


def open_following(path: os.PathLike[str], log_bytes: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)  # as before the fix: links followed
    if os.fstat(fd).st_size < log_bytes:
        os.posix_fallocate(fd, 0, log_bytes)
        os.pwrite(fd, bytes(log_bytes), 0)
        os.fsync(fd)
    return fd


folds = [0]


def stop_at_second_fold() -> None:
    folds[0] += 1
    if folds[0] == 2:
        os.kill(os.getpid(), signal.SIGSTOP)


def apply_then_stop(conn: Any, pending: Any) -> None:
    original_apply(conn, pending)
    stop_at_second_fold()  # inside the fold's transaction: the file's write lock held, nothing committed


def fold_then_stop(self: SQLiteRecords, pending: Any, generation: int) -> None:
    original_fold(self, pending, generation)
    stop_at_second_fold()  # committed: the file is of the next generation, the log not yet written in it


original_apply = sqlite_package.apply_log_changes
original_fold = SQLiteRecords.fold_log

for control in sys.argv[1].split(","):
    if control == "folds-every-20":
        SQLiteRecords.open_log = open_log_folding_every_20  # type: ignore[method-assign]
    elif control == "log-follows-links":
        _log._open_preallocated = open_following  # type: ignore[assignment]
    elif control == "log-stays-astray":
        _log.RecordLog._at_path = lambda self: True  # type: ignore[method-assign]
    elif control == "epochs-off":
        SQLiteRecords.epochs = False
    elif control == "stop-in-fold":
        sqlite_package.apply_log_changes = apply_then_stop  # type: ignore[assignment]
    elif control == "stop-after-fold":
        SQLiteRecords.fold_log = fold_then_stop  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown control {control!r}")

asyncio.set_event_loop_policy(None)
sys.exit(serve.run(sys.argv[2:]))
