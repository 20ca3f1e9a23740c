"""A small tmpfs to fill to the last byte: the full disk of the fault tests (needs root to mount)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: Acquires of new scopes tried on the full disk before a check gives up.
ACQUIRES_ON_FULL_DISK_MAX = 50
#: How long a cluster may take to come back after its servers are started again.
BACK_S = 120

__all__ = ["can_mount", "small_tmpfs", "fill", "cluster_on_a_full_disk", "one_member_on_a_full_disk"]


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


def cluster_on_a_full_disk(url: str, mount: Path, restart: Callable[[], None], env: dict[str, str]) -> None:
    """What a coordinator on servers whose disk fills must do (etcd, ZooKeeper): check it, on the disk of ``mount``.

    - an acquire fails as `BackendUnavailable`, one line; `stockade lock` prints
      one line, no traceback, and exits 1;
    - a held lease is marked lost by its own deadline (K2);
    - once there is room and ``restart`` started the servers that stopped, the
      scopes go on above every token they had.
    """
    import stockade
    from stockade.core.errors import BackendUnavailable

    coord = stockade.connect(url)
    try:
        before = []
        for _ in range(3):
            lease = coord.acquire("a", ttl_ms=5_000, keepalive=False)
            before.append(lease.token.value)
            lease.release()
        held = coord.acquire("held", ttl_ms=3_000)
        fill(mount / "filler")

        refused = None
        for i in range(ACQUIRES_ON_FULL_DISK_MAX):
            try:
                coord.acquire(f"new-{i}", ttl_ms=5_000, wait_ms=0, keepalive=False).release()
            except BackendUnavailable as exc:
                refused = exc
                break
        assert refused is not None, f"{ACQUIRES_ON_FULL_DISK_MAX} grants on a full disk"
        assert "\n" not in str(refused) and not str(refused).endswith(": "), str(refused)
        assert held.wait_lost(timeout_ms=60_000), "a held lease outlived servers that stopped answering"
        done = subprocess.run([sys.executable, "-m", "stockade", "lock", "cli", "--url", url, "--ttl-ms", "5000",
                               "--wait-ms", "0", "--", "true"], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

        (mount / "filler").unlink()
        restart()
        deadline = time.monotonic() + BACK_S
        while True:
            try:
                after = coord.acquire("a", ttl_ms=5_000, wait_ms=5_000, keepalive=False)
                break
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    raise
        assert after.token.value > max(before)
        after.release()
        again = coord.acquire("held", ttl_ms=5_000, wait_ms=30_000, keepalive=False)
        assert again.token.value > held.token.value
        again.release()
    finally:
        coord.close()


#: Grant rounds (one grant on each scope) on the cluster while one member's disk is full, at most.
ROUNDS_UNTIL_GONE_MAX = 100
SCOPES = ("s1", "s2", "s3", "s4")


def _round(coord, tokens: dict[str, list[int]]) -> None:
    """One grant and release on each scope; a failover in between (the full member led) is waited out."""
    from stockade.core.errors import BackendUnavailable

    for scope in SCOPES:
        deadline = time.monotonic() + BACK_S
        while True:
            try:
                lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=15_000, keepalive=False)
                break
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        tokens[scope].append(lease.token.value)
        with contextlib.suppress(BackendUnavailable):  # the server it went through failed: the lease expires
            lease.release()


def one_member_on_a_full_disk(url: str, mount: Path, gone: Callable[[], bool], restart: Callable[[], None],
                              member_url: str) -> dict[str, int]:
    """One member of three on a full disk (the others have room): the cluster goes on, the member comes back.

    - grants go on while the member fails and after it is gone (two of three
      are a majority), each scope's tokens strictly increasing;
    - the member is really gone (``gone``): the fault took effect;
    - with room again and the member started (``restart``), grants made through
      it alone (``member_url``) go on above every token before.

    Returns counts for the report: grants in all, and grants while the disk was full.
    """
    import stockade

    tokens: dict[str, list[int]] = {scope: [] for scope in SCOPES}
    coord = stockade.connect(url)
    try:
        for _ in range(3):
            _round(coord, tokens)
        fill(mount / "filler")
        during = 0
        while not gone() and during < ROUNDS_UNTIL_GONE_MAX:
            _round(coord, tokens)
            during += 1
        assert gone(), f"the member on the full disk still runs after {during} rounds"
        for _ in range(5):
            _round(coord, tokens)
        during += 5
    finally:
        coord.close()
    (mount / "filler").unlink()
    restart()
    through_member = stockade.connect(member_url)
    try:
        for _ in range(3):
            _round(through_member, tokens)
    finally:
        through_member.close()
    for scope, values in tokens.items():
        assert values == sorted(set(values)), f"{scope}: tokens not strictly increasing: {values}"
    return {"grants": sum(len(v) for v in tokens.values()), "rounds_on_full_disk": during}
