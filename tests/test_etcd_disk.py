"""A full disk under a real three-member etcd 3.4 cluster.

etcd cannot write its WAL, and its members exit. (Not the space quota of
tests/test_etcd_space.py: the disk itself.) What stockade must do, and this
test checks on a tmpfs filled to the last byte:

- an acquire fails as `BackendUnavailable`, one line, no traceback from
  `stockade lock`;
- a held lease is marked lost by its own deadline (K2), as for any cluster
  that stopped answering;
- once there is room again and the members are started again, the scopes go
  on above every token they had (revisions only grow).
"""

from __future__ import annotations

import os

import pytest
from conftest import python_env
from helpers import full_disk

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

#: Each member preallocates a 64 MB WAL file.
TMPFS_SIZE = "400m"


def test_a_full_disk_fails_typed_loses_held_leases_and_tokens_go_on_after() -> None:
    from helpers.etcd_cluster import EtcdCluster, etcd_available

    if not etcd_available() and os.environ.get("CI") != "true":
        pytest.skip("etcd is not installed (scripts/test.sh installs it; CI never skips)")
    with full_disk.small_tmpfs(TMPFS_SIZE) as mount:
        cluster = EtcdCluster(mount / "etcd")

        def restart() -> None:
            for name in cluster.names:
                if cluster.processes[name].poll() is not None:
                    cluster.start(name)
            cluster.wait_healthy()

        try:
            full_disk.cluster_on_a_full_disk(cluster.url, mount, restart, python_env())
        finally:
            cluster.stop()
