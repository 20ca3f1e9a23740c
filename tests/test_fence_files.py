"""A fenced directory under faults a thread test cannot make: real writer processes paused and killed.

- A writer process SIGSTOPped inside a batch holds the scope's flock: a higher
  token's write waits for it, and the paused batch ends applied whole before
  it (control: check-then-write, whose second write lands after the higher one).
- kill -9 of a writer process mid-batch, `KILLS` times: every file is old or
  new, never torn, and the mark on disk is never behind the data (controls:
  writing in place tears files; writing the data before the mark leaves the
  mark behind).
- A symbolic link planted for the scope directory or a file is refused or
  replaced, never followed (control: a plain open follows it out).
- A read-only directory or a full disk is `BackendUnavailable`, and the old
  file and the mark are unchanged.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import full_disk
from helpers.fence_files import FILE_BYTES, paused_rounds, start, token_of

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.tokens import FencingToken
from stockade.keys import KeyFile, create_keyring
from stockade.resources.files import FencedDirectory

CLUSTER = "feedfacefeedface"
KILLS = 12
PAUSED_ROUNDS = 5
LONG = os.environ.get("STOCKADE_LONG") == "1"
if LONG:
    KILLS, PAUSED_ROUNDS = 50, 20


@pytest.fixture
def keys(tmp_path: Path) -> KeyFile:
    path = tmp_path / "coord.keys"
    create_keyring(path, CLUSTER)
    return KeyFile(path)


def tok(keys: Any, value: int, scope: str = "a") -> FencingToken:
    return keys.sign(FencingToken(CLUSTER, scope, value))


# -- SIGSTOP: a paused holder of the flock ------------------------------------------------------------


def test_a_paused_writer_process_holds_off_a_higher_token_and_ends_whole_before_it(
    tmp_path: Path, keys: KeyFile
) -> None:
    results = paused_rounds("files", tmp_path, keys, PAUSED_ROUNDS)
    assert results["none"] == 0, f"interleavings {results['none']} of {PAUSED_ROUNDS}"
    assert results["check-then-write"] > 0, "the control was not caught"


# -- kill -9 mid-write --------------------------------------------------------------------------------


def kill_rounds(tmp_path: Path, keys: KeyFile, mode: str, kills: int,
                until: Callable[[int, int], bool] = lambda torn, behind: False) -> tuple[int, int]:
    """Kill a writer process ``kills`` times at random moments, or until ``until(torn, behind)`` (a control's
    first catch); (torn files, marks behind the data)."""
    path = tmp_path / mode
    rng = random.Random(kills)
    torn = behind = 0
    next_value = 1
    for _ in range(kills):
        child = start("loop", "files", str(path), str(keys.path), CLUSTER, str(next_value), mode)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        threading.Event().wait(rng.uniform(0.001, 0.03))  # where the kill lands: any point of a write
        child.kill()
        child.wait()
        with FencedDirectory(path, keys=keys, file_bytes_max=FILE_BYTES) as directory:
            mark = directory.high_water("a")
            for name in ("f", "g"):
                data = directory.read(name, scope="a")
                value = None if data is None else token_of(data)
                if value is None:
                    torn += 1
                elif value > mark:
                    behind += 1
                else:
                    next_value = max(next_value, value + 1)
            next_value = max(next_value, mark + 1)
            directory.clean()
        if until(torn, behind):
            break
    return torn, behind


def test_kill_9_mid_write_leaves_old_or_new_files_and_the_mark_never_behind(tmp_path: Path, keys: KeyFile) -> None:
    torn, behind = kill_rounds(tmp_path, keys, "fenced", KILLS)
    assert (torn, behind) == (0, 0), f"torn files {torn}, marks behind the data {behind}, of {KILLS} kills"


def test_kill_9_controls_tear_files_and_leave_the_mark_behind(tmp_path: Path, keys: KeyFile) -> None:
    """Each control stops at its first catch (of at most `KILLS` kills)."""
    torn, _ = kill_rounds(tmp_path, keys, "in-place", KILLS, until=lambda torn, behind: torn > 0)
    assert torn > 0, "writing in place was never caught torn"
    _, behind = kill_rounds(tmp_path, keys, "data-first", KILLS, until=lambda torn, behind: behind > 0)
    assert behind > 0, "writing the data before the mark was never caught"


# -- names and links ----------------------------------------------------------------------------------


def test_bad_names_are_invalid_argument(tmp_path: Path, keys: KeyFile) -> None:
    with FencedDirectory(tmp_path / "d", keys=keys) as directory:
        for name in ("", ".", "..", "../x", "a/b", "x\x00", "é" * 200, ".stockade-lock", ".stockade-high-water"):
            with pytest.raises(InvalidArgument):
                directory.write(name, b"evil", tok(keys, 1))
        with pytest.raises(InvalidArgument):
            directory.write("x", b"evil", tok(keys, 1, scope=".."), scope="..")
        assert not (tmp_path / "d" / "a").exists() or directory.names(scope="a") == []


def test_a_planted_symlink_is_never_followed(tmp_path: Path, keys: KeyFile) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"keep")
    root = tmp_path / "d"
    with FencedDirectory(root, keys=keys) as directory:
        os.symlink(outside, root / "a")  # the scope directory is a link out
        with pytest.raises(BackendUnavailable):
            directory.write("secret", b"evil", tok(keys, 1))
        with pytest.raises(BackendUnavailable):
            directory.read("secret", scope="a")
        # A file link inside a real scope directory: a read refuses it, a write replaces the link itself.
        directory.write("f", b"mine", tok(keys, 1, scope="b"))
        os.symlink(outside / "secret", root / "b" / "link")
        with pytest.raises(BackendUnavailable):
            directory.read("link", scope="b")
        directory.write("link", b"replaced", tok(keys, 1, scope="b"))
        assert not (root / "b" / "link").is_symlink()
    assert (outside / "secret").read_bytes() == b"keep" and sorted(os.listdir(outside)) == ["secret"]
    # The control: a plain open of the same path follows the link out of the directory.
    with open(root / "a" / "secret", "wb") as plain:
        plain.write(b"escaped")
    assert (outside / "secret").read_bytes() == b"escaped"


# -- a read-only directory, a full disk ---------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="needs root and chattr")
def test_a_read_only_directory_is_a_typed_error_and_changes_nothing(tmp_path: Path, keys: KeyFile) -> None:
    root = tmp_path / "d"
    with FencedDirectory(root, keys=keys) as directory:
        directory.write("f", b"old", tok(keys, 3))
        before = _snapshot(root)
        subprocess.run(["chattr", "+i", str(root / "a")], check=True)
        try:
            for value in (3, 4):  # the same token, and a higher one that would raise the mark
                with pytest.raises(BackendUnavailable) as info:
                    directory.write("f", b"new", tok(keys, value))
                assert info.value.certain_no_effect
        finally:
            subprocess.run(["chattr", "-i", str(root / "a")], check=True)
        assert _snapshot(root) == before and directory.high_water("a") == 3


@pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")
def test_a_full_disk_is_a_typed_error_and_leaves_the_old_file(keys: KeyFile) -> None:
    with full_disk.small_tmpfs("1m") as mount, FencedDirectory(mount / "d", keys=keys) as directory:
        directory.write("f", b"old" * 1000, tok(keys, 3))
        before = _snapshot(mount / "d")
        with pytest.raises(BackendUnavailable) as info:
            directory.write("f", b"x" * (2 << 20), tok(keys, 4))
        assert info.value.certain_no_effect
        assert _snapshot(mount / "d") == before and directory.high_water("a") == 3
        assert sorted(os.listdir(mount / "d" / "a")) == [".stockade-high-water", ".stockade-lock", "f"]


def test_a_remembered_token_never_vouches_for_another_mac(tmp_path: Path, keys: KeyFile) -> None:
    """A handle remembers tokens that passed; a token differing only in its MAC (or value) is checked afresh."""
    from stockade.core.errors import TokenMismatch

    with FencedDirectory(tmp_path / "d", keys=keys) as directory:
        good = tok(keys, 5)
        directory.write("f", b"good", good)
        directory.write("f", b"good", good.encode())
        forged = FencingToken(CLUSTER, "a", 5, good.kid, good.mac[:-1] + ("A" if good.mac[-1] != "A" else "B"))
        for bad in (forged, forged.encode(), FencingToken(CLUSTER, "a", 6, good.kid, good.mac)):
            with pytest.raises(TokenMismatch):
                directory.write("f", b"evil", bad)
        assert directory.read("f", scope="a") == b"good" and directory.high_water("a") == 5
