"""One member of a three-member etcd cluster or ZooKeeper ensemble on a full disk; the other two have room.

A careless operator puts one server's data on a disk that fills (a shared
volume, a log that grew). That server cannot write its log: the etcd member
exits, the ZooKeeper server stays up but leaves the ensemble and serves
nothing (its clients lose their connection and move to another server). The
other two are a majority and go on. What stockade must do, on real servers,
one data directory on a tmpfs filled to the last byte
(`helpers.full_disk.one_member_on_a_full_disk`):

- grants go on throughout (one that meets the failover, when the full member
  led, is retried), each scope's tokens strictly increasing;
- the member is really gone: the fault took effect (the guard against a test
  that passes because nothing happened);
- with room again and the member started, grants made through it alone go on
  above every token before.

The figures are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import full_disk

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")


def _on_the_small_disk(root: Path, name: str, mount: Path) -> None:
    """The data directory ``root/name`` lives on ``mount`` (a symlink, made before the server first starts)."""
    root.mkdir(parents=True, exist_ok=True)
    (mount / name).mkdir(mode=0o700)
    (root / name).symlink_to(mount / name)


def test_etcd_one_member_on_a_full_disk(tmp_path):
    from helpers.etcd_cluster import EtcdCluster, etcd_available

    if not etcd_available() and os.environ.get("CI") != "true":
        pytest.skip("etcd is not installed (scripts/test.sh installs it; CI never skips)")
    with full_disk.small_tmpfs("400m") as mount:
        root = tmp_path / "etcd"
        _on_the_small_disk(root, "n1", mount)
        cluster = EtcdCluster(root)
        try:
            def gone() -> bool:
                return cluster.processes["n1"].poll() is not None

            def restart() -> None:
                cluster.start("n1")
                cluster.wait_healthy(["n1"])

            figures = full_disk.one_member_on_a_full_disk(cluster.url, mount, gone, restart,
                                                          "etcd://" + cluster.client_url("n1").removeprefix("http://"))
        finally:
            cluster.stop()
    print(f"etcd, one member of three on a full disk: {figures}")


def test_zookeeper_one_server_on_a_full_disk(tmp_path):
    from helpers.zk_ensemble import ZkEnsemble, zookeeper_available

    if not zookeeper_available() and os.environ.get("CI") != "true":
        pytest.skip("ZooKeeper is not installed (scripts/test.sh installs it; CI never skips)")
    with full_disk.small_tmpfs("96m") as mount:
        root = tmp_path / "zk"
        _on_the_small_disk(root, "zk1", mount)
        ensemble = ZkEnsemble(root)
        try:
            def gone() -> bool:  # it stays up, but out of the ensemble: it serves nothing
                return ensemble.mode(1) not in ("leader", "follower")

            def restart() -> None:
                if ensemble.processes[1].poll() is None:
                    ensemble.kill(1)
                ensemble.start(1)
                ensemble.wait_serving()

            figures = full_disk.one_member_on_a_full_disk(ensemble.url, mount, gone, restart,
                                                          f"zookeeper://127.0.0.1:{ensemble.client_ports[1]}")
        finally:
            ensemble.stop()
    print(f"ZooKeeper, one server of three on a full disk: {figures}")
