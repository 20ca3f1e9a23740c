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

import pytest
from conftest import python_env
from helpers import full_disk

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

TMPFS_SIZE = "96m"


def test_a_full_disk_fails_typed_loses_held_leases_and_tokens_go_on_after() -> None:
    from helpers.zk_ensemble import ZkEnsemble, zookeeper_available

    if not zookeeper_available() and os.environ.get("CI") != "true":
        pytest.skip("ZooKeeper is not installed (scripts/test.sh installs it; CI never skips)")
    with full_disk.small_tmpfs(TMPFS_SIZE) as mount:
        ensemble = ZkEnsemble(mount / "zk")

        def restart() -> None:
            for i in ensemble.ids:
                if ensemble.processes[i].poll() is not None:
                    ensemble.start(i)
            ensemble.wait_serving()

        try:
            full_disk.cluster_on_a_full_disk(ensemble.url, mount, restart, python_env())
        finally:
            ensemble.stop()
