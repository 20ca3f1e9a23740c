"""The fence harness over a fenced directory (`stockade.resources.files`).

A unit is one batch on one scope: ``unit.write(key, value)`` stages the file
``key``; the batch is applied when the unit ends. The suite's R6 and S20 tests
see whole batches: the scope's lock is held from the check to the last rename.
What they do not see is a crash in the middle of a multi-file batch (files are
atomic one by one; tests/test_fence_files.py covers kill -9 per file).

Controls: ``fencing-off`` and ``strict-greater`` swap the directory's
``fence_rule``; ``check-then-write`` reads the mark in one step, judges it,
calls ``between_check_and_write``, then writes each file in a batch of its own
whose rule trusts the earlier check.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.fence_sqlite_db import trusting

from stockade.core.fence import Accept, Reject, decide
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys
from stockade.resources._inputs import coerce_token
from stockade.resources._observe import reject
from stockade.resources.files import FencedDirectory
from stockade.testing.mutants import accept_everything, reject_equal

SCOPES = ("a", "b")


class FilesHarness:
    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> None:
        self.path, self.cluster_id, self.keys, self.mutant = path, cluster_id, keys, mutant
        self.directory = self._open()
        if mutant == "fencing-off":
            self.directory.fence_rule = accept_everything
        elif mutant == "strict-greater":
            self.directory.fence_rule = reject_equal
        else:
            assert mutant in (None, "check-then-write"), mutant

    def _open(self) -> FencedDirectory:
        return FencedDirectory(self.path, keys=self.keys, cluster_id=self.cluster_id,
                               file_bytes_max=self.value_bytes_max)

    def fenced(self, scope: str, token: Any) -> Any:
        if self.mutant == "check-then-write":
            return self._check_then_write(scope, token)
        return self.directory.batch(token, scope=scope)

    @contextmanager
    def _check_then_write(self, scope: str, token: Any) -> Iterator[Any]:
        checked = coerce_token(token)
        decision = decide(checked, cluster=self.cluster_id, scope=scope, high_water=self.directory.high_water(scope))
        if isinstance(decision, Reject):
            reject(decision, resource=self.directory.resource, cluster=self.cluster_id, token=checked,
                   scope=scope, key=None)
        assert isinstance(decision, Accept)
        if self.between_check_and_write is not None:
            self.between_check_and_write()
        harness = self

        class EachStepAlone:
            def write(self, key: str, value: bytes) -> None:
                with harness._open() as directory:
                    directory.fence_rule = trusting(decision)
                    directory.write(key, value, checked, scope=scope)

            def read(self, key: str) -> bytes | None:
                return harness.read(scope, key)

        yield EachStepAlone()

    def read(self, scope: str, key: str) -> bytes | None:
        return self.directory.read(key, scope=scope)

    def high_water(self, scope: str) -> int:
        return self.directory.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self.directory.raise_high_waters(floors, default=default)

    def state(self) -> Any:
        d = self.directory
        return (d.high_waters(), d.default_floor(),
                {s: {n: d.read(n, scope=s) for n in d.names(scope=s)} for s in SCOPES})

    def clone(self) -> FilesHarness:
        other = FilesHarness(self.path, self.cluster_id, self.keys, self.mutant)
        other.between_check_and_write = self.between_check_and_write
        return other

    def close(self) -> None:
        self.directory.close()


def make_files_harness(path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> FilesHarness:
    return FilesHarness(path / "files", cluster_id, keys, mutant)


# -- a writer process, for the kill -9 and SIGSTOP tests (tests/test_fence_files.py) ---------------

FILE_BYTES = 256 * 1024  # big enough that a kill lands inside a write


def content(value: int) -> bytes:
    """A file written under token ``value``: the value repeated to FILE_BYTES (torn if not uniform and whole)."""
    line = b"%019d\n" % value
    return line * (FILE_BYTES // len(line))


def token_of(data: bytes) -> int | None:
    """The token value a file was written under, or None if the file is torn."""
    line = data[:20]
    return int(line) if len(data) == FILE_BYTES - FILE_BYTES % 20 and data == line * (len(data) // 20) else None


def _writer_loop(path: Path, keys: Any, cluster_id: str, start: int, mode: str) -> None:
    """Write files f and g of scope a with tokens start, start+1, ... until killed."""
    import os

    from stockade.core.tokens import FencingToken
    from stockade.resources.files import _io as fio

    directory = FencedDirectory(path, keys=keys, cluster_id=cluster_id, file_bytes_max=FILE_BYTES)
    value = start
    while True:
        token = keys.sign(FencingToken(cluster_id, "a", value))
        if mode == "fenced":
            with directory.batch(token) as batch:
                batch.write("f", content(value))
                batch.write("g", content(value))
        else:  # the controls work on the same layout, without the adapter's order
            scope_fd, _ = fio.open_dir("a", os.open(path, os.O_RDONLY | os.O_DIRECTORY), create=True)
            for name in ("f", "g"):
                if mode == "in-place":  # no temp file: a kill leaves a torn file
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=scope_fd)
                    data = content(value)
                    for i in range(0, len(data), 4096):
                        os.write(fd, data[i:i + 4096])
                    os.close(fd)
                else:  # "data-first": the data replaced durably, the mark after it
                    fio.replace_durably(scope_fd, name, content(value))
            if mode == "data-first":
                fio.replace_durably(scope_fd, fio.MARK_NAME, b"%d\n" % value)
            os.close(scope_fd)
        if value == start:
            print("ready", flush=True)
        value += 1


def _paused_unit(harness: Any, token: str) -> None:
    """Open a unit, write k, say "open", wait for a line on stdin, write n, end the unit; say how it ended."""
    import sys

    from stockade.core.errors import StaleToken

    try:
        with harness.fenced("a", token) as unit:
            unit.write("k", b"A1")
            print("open", flush=True)
            sys.stdin.readline()
            unit.write("n", b"A2")
    except StaleToken:
        print("refused", flush=True)
        return
    print("done", flush=True)


def main(argv: list[str]) -> None:
    """``fence_files.py loop|paused files|sqlite-db PATH KEYRING CLUSTER ARG MODE`` (run by the fault tests)."""
    from stockade.keys import KeyFile

    what, adapter, path, keyring, cluster_id, arg, mode = argv
    keys = KeyFile(keyring)
    if what == "loop":
        _writer_loop(Path(path), keys, cluster_id, int(arg), mode)
        return
    mutant = None if mode == "none" else mode
    if adapter == "files":
        harness: Any = FilesHarness(Path(path), cluster_id, keys, mutant)  # type: ignore[arg-type]
    else:
        from helpers.fence_sqlite_db import SQLiteDbHarness

        harness = SQLiteDbHarness(Path(path), cluster_id, keys, mutant)  # type: ignore[arg-type]
    _paused_unit(harness, arg)


# -- driving writer processes from the tests ----------------------------------------------------------

TESTS = Path(__file__).parent.parent
HELPER = Path(__file__)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    return env


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HELPER), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=child_env())


def paused_round(adapter: str, path: Path, keys: Any, cluster_id: str, low: int, mutant: str) -> tuple[bool, str]:
    """A child opens a unit with ``low``, writes k, and is SIGSTOPped; B writes with low+1; A resumes.

    Returns (interleaved, how A ended). Interleaved: B finished while A was
    stopped (so it did not wait), or A's second write landed after B's.
    """
    token = keys.sign(FencingToken(cluster_id, "a", low)).encode()
    child = start("paused", adapter, str(path), str(keys.path), cluster_id, token, mutant)
    from helpers.fence_sqlite_db import SQLiteDbHarness

    harness: Any = (FilesHarness if adapter == "files" else SQLiteDbHarness)(path, cluster_id, keys, None)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "open"
        os.kill(child.pid, signal.SIGSTOP)
        b_done = threading.Event()
        errors: list[BaseException] = []

        def b_writes() -> None:
            try:
                with harness.fenced("a", keys.sign(FencingToken(cluster_id, "a", low + 1))) as unit:
                    unit.write("k", b"B")
                    unit.write("n", b"B")
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)
            finally:
                b_done.set()

        b = threading.Thread(target=b_writes)
        b.start()
        # B must not finish while A holds the lock; waiting longer can only make a failure show, never hide one.
        finished_while_stopped = b_done.wait(0.3)
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        ended = child.stdout.readline().strip()
        b.join()
        assert not errors, f"B failed: {errors[0]!r}"
        last = (harness.read("a", "k"), harness.read("a", "n"))
        return finished_while_stopped or last != (b"B", b"B"), ended
    finally:
        child.kill()
        child.wait()
        harness.close()


def paused_rounds(adapter: str, tmp_path: Path, keys: Any, rounds: int) -> dict[str, int]:
    """`paused_round` ``rounds`` times on the adapter and on its check-then-write control; interleavings of each."""
    from helpers.fence_sqlite_db import user_database

    results = {}
    for mutant in ("none", "check-then-write"):
        path = tmp_path / mutant / ("files" if adapter == "files" else "user.db")
        if adapter == "sqlite-db":
            user_database(path)
        interleaved = 0
        for i in range(rounds):
            mixed, ended = paused_round(adapter, path, keys, keys.cluster_id, 2 * i + 1, mutant)
            interleaved += mixed
            if mutant == "none":
                assert ended == "done", "the paused unit passed its check before B came, so it commits whole"
        results[mutant] = interleaved
    return results


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
