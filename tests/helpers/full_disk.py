"""A small tmpfs to fill to the last byte: the full disk of the fault tests (needs root to mount)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["can_mount", "small_tmpfs", "fill"]


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, with ``mount`` installed)."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``), readable by every user (servers run as their own), unmounted after.

    Not under pytest's ``tmp_path``: a server that runs as another user must reach it.
    """
    mount = Path(tempfile.mkdtemp(prefix="stockade-full-disk-"))
    os.chmod(mount, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        mount.rmdir()


def fill(path: Path) -> None:
    """Write zeros to the new file ``path`` until its file system has not one byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
