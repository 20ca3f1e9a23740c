"""Writer processes over a fenced directory or a user's SQLite file, for the kill -9 and SIGSTOP tests
(tests/test_fence_files.py, tests/test_fence_sqlite_db.py). The harnesses they drive are the conformance
kit's (`stockade.testing.fences.files`, `stockade.testing.fences.sqlite_db`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from stockade.core.tokens import FencingToken
from stockade.resources.files import FencedDirectory
from stockade.testing.fences.files import FilesHarness

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
        from stockade.testing.fences.sqlite_db import SQLiteDbHarness

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
    from stockade.testing.fences.sqlite_db import SQLiteDbHarness

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
    from stockade.testing.fences.sqlite_db import user_database

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
