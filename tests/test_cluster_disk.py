"""A full disk under a real etcd 3.4 cluster (three members) and a real ZooKeeper ensemble (three servers).

The servers cannot write their logs (etcd's WAL, ZooKeeper's transaction
log; not etcd's space quota, which tests/test_etcd_space.py covers) and
exit. What stockade must do, checked on a tmpfs filled to the last byte
(`helpers.full_disk.cluster_on_a_full_disk`):

- an acquire fails as `BackendUnavailable`, one line; so does
  `stockade lock`;
- a held lease is marked lost by its own deadline (K2), as for any servers
  that stopped answering;
- once there is room again and the servers are started again, the scopes go
  on above every token they had.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import python_env
from helpers import full_disk

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")


def _etcd(root: Path) -> tuple[str, Callable[[], None], Callable[[], None]]:
    from helpers.etcd_cluster import EtcdCluster, etcd_available

    if not etcd_available() and os.environ.get("CI") != "true":
        pytest.skip("etcd is not installed (scripts/test.sh installs it; CI never skips)")
    cluster = EtcdCluster(root)

    def restart() -> None:
        for name in cluster.names:
            if cluster.processes[name].poll() is not None:
                cluster.start(name)
        cluster.wait_healthy()

    return cluster.url, restart, cluster.stop


def _zookeeper(root: Path) -> tuple[str, Callable[[], None], Callable[[], None]]:
    from helpers.zk_ensemble import ZkEnsemble, zookeeper_available

    if not zookeeper_available() and os.environ.get("CI") != "true":
        pytest.skip("ZooKeeper is not installed (scripts/test.sh installs it; CI never skips)")
    ensemble = ZkEnsemble(root)

    def restart() -> None:
        for i in ensemble.ids:
            if ensemble.processes[i].poll() is not None:
                ensemble.start(i)
        ensemble.wait_serving()

    return ensemble.url, restart, ensemble.stop


#: Each backend, its servers' start, and the tmpfs it needs (an etcd member preallocates a 64 MB WAL file).
BACKENDS = {"etcd": (_etcd, "400m"), "zookeeper": (_zookeeper, "96m")}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_full_disk_fails_typed_loses_held_leases_and_tokens_go_on_after(backend: str) -> None:
    start, size = BACKENDS[backend]
    with full_disk.small_tmpfs(size) as mount:
        url, restart, stop = start(mount / backend)
        try:
            full_disk.cluster_on_a_full_disk(url, mount, restart, python_env())
        finally:
            stop()
