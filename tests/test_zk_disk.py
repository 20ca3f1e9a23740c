"""A full disk under a real three-server ZooKeeper ensemble.

ZooKeeper cannot write its transaction log, and its servers stop serving
(here they exit). What stockade must do, and this test checks on a tmpfs
filled to the last byte:

- an acquire fails as `BackendUnavailable`, one line, no traceback from
  `stockade lock`;
- a held lease is marked lost by its own deadline (K2), as for any ensemble
  that stopped answering;
- once there is room again and the servers are started again, the scopes go
  on above every token they had (the new leader's epoch is higher).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import python_env
from helpers import full_disk

import stockade
from stockade.core.errors import BackendUnavailable

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

TMPFS_SIZE = "96m"
#: Acquires of new scopes tried on the full disk before the test gives up.
ACQUIRES_ON_FULL_DISK_MAX = 50
#: How long the ensemble may take to come back after its servers are started again.
BACK_S = 120


def test_a_full_disk_fails_typed_loses_held_leases_and_tokens_go_on_after(tmp_path: Path) -> None:
    from helpers.zk_ensemble import ZkEnsemble, zookeeper_available

    if not zookeeper_available() and os.environ.get("CI") != "true":
        pytest.skip("ZooKeeper is not installed (scripts/test.sh installs it; CI never skips)")
    with full_disk.small_tmpfs(TMPFS_SIZE) as mount:
        ensemble = ZkEnsemble(mount / "zk")
        try:
            _full_disk_under_zookeeper(ensemble, mount)
        finally:
            ensemble.stop()


def _full_disk_under_zookeeper(ensemble, mount: Path) -> None:
    coord = stockade.connect(ensemble.url)
    try:
        before = []
        for _ in range(3):
            lease = coord.acquire("a", ttl_ms=5_000, keepalive=False)
            before.append(lease.token.value)
            lease.release()
        held = coord.acquire("held", ttl_ms=3_000)
        full_disk.fill(mount / "filler")

        refused = None
        for i in range(ACQUIRES_ON_FULL_DISK_MAX):
            try:
                coord.acquire(f"new-{i}", ttl_ms=5_000, wait_ms=0, keepalive=False).release()
            except BackendUnavailable as exc:
                refused = exc
                break
        assert refused is not None, f"{ACQUIRES_ON_FULL_DISK_MAX} grants on a full disk"
        assert "\n" not in str(refused) and not str(refused).endswith(": "), str(refused)
        assert held.wait_lost(timeout_ms=60_000), "a held lease outlived an ensemble that stopped answering"
        done = subprocess.run([sys.executable, "-m", "stockade", "lock", "cli", "--url", ensemble.url,
                               "--ttl-ms", "5000", "--wait-ms", "0", "--", "true"], capture_output=True, text=True,
                              timeout=120, env=python_env())
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

        (mount / "filler").unlink()
        for i in ensemble.ids:
            if ensemble.processes[i].poll() is not None:
                ensemble.start(i)
        ensemble.wait_serving()
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
