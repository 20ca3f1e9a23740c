"""Start, restart or stop a whole three-member etcd cluster or three-server ZooKeeper ensemble kept in HOME.

What a user's ``--coordinator-restart`` command would do with their own cluster:

    python tests/helpers/ensemble_restart.py start etcd|zookeeper HOME
    python tests/helpers/ensemble_restart.py restart HOME [--fresh]
    python tests/helpers/ensemble_restart.py stop HOME

``start`` runs the members of tests/helpers/etcd_cluster.py or
tests/helpers/zk_ensemble.py (same command lines, same configuration), each in
a session of its own, with its pid in HOME/pids.json and its ports in
HOME/cluster.json, and returns once every member serves; it prints the
cluster's url. ``restart`` ends every member by its pid (SIGTERM, SIGKILL
after 20 s), waits until all are gone (a whole-cluster outage, not a rolling
one), starts them again on the same ports and data directories, and returns
once every member serves again (etcd: ``/health`` on each; ZooKeeper: each in
quorum and answering a write). ``--fresh`` is the control of
tests/test_check_failover.py: every data directory is wiped first (ZooKeeper's
``myid`` kept), so the cluster comes back empty, as a cluster restored from
nothing. Nothing but the pids in HOME/pids.json is ever signalled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: `helpers` importable

from helpers.etcd_cluster import EtcdCluster  # noqa: E402
from helpers.zk_ensemble import ZkEnsemble  # noqa: E402

from stockade.testing.servers.reaper import start_time  # noqa: E402

STOP_S = 20.0
READY_S = 120.0


def _spawn(home: Path, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A member in a session of its own (it outlives this script), its pid added to HOME/pids.json."""
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    members = [[pid, start_time(pid)] for pid in _pids(home)]  # the ones still running
    (home / "pids.json").write_text(json.dumps([*members, [process.pid, start_time(process.pid)]]))
    return process


def _pids(home: Path) -> list[int]:
    """The members recorded in HOME/pids.json that still run: a pid whose start time is not the one recorded
    with it is another process's by now (pids come round), and is never signalled."""
    try:
        entries = json.loads((home / "pids.json").read_text())
        return [int(pid) for pid, began in entries if start_time(int(pid)) == began]
    except (OSError, ValueError, TypeError):
        return []


class DetachedEtcd(EtcdCluster):
    """The fixtures' etcd cluster, its members detached from this script and not watched by a reaper."""

    kind = "etcd"
    home: Path

    def _spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return _spawn(self.home, argv, log)


class DetachedZk(ZkEnsemble):
    """The fixtures' ZooKeeper ensemble, its servers detached from this script and not watched by a reaper."""

    kind = "zookeeper"
    home: Path

    def _spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return _spawn(self.home, argv, log)


def start(kind: str, home: Path) -> str:
    home.mkdir(parents=True, exist_ok=True)
    DetachedEtcd.home = DetachedZk.home = home
    if kind == DetachedEtcd.kind:
        etcd = DetachedEtcd(home / "data")
        state: dict[str, Any] = {"kind": kind, "url": etcd.url, "client_ports": etcd.client_ports,
                                 "peer_ports": etcd.peer_ports, "token": etcd.token}
    elif kind == DetachedZk.kind:
        zk = DetachedZk(home / "data")
        zk.wait_serving(READY_S)
        state = {"kind": kind, "url": zk.url, "client_ports": zk.client_ports}
    else:
        sys.exit(f"unknown kind {kind!r} (etcd or zookeeper)")
    (home / "cluster.json").write_text(json.dumps(state))
    return str(state["url"])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(home: Path) -> None:
    """End every member (SIGTERM to each, then wait for all; SIGKILL to any left after ``STOP_S``)."""
    pids = [pid for pid in _pids(home) if _alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    while any(_alive(pid) for pid in pids):
        time.sleep(0.02)
    (home / "pids.json").unlink(missing_ok=True)


def rebuilt(home: Path) -> DetachedEtcd | DetachedZk:
    """The cluster of HOME as the helper's class sees it, without starting anything."""
    state = json.loads((home / "cluster.json").read_text())
    DetachedEtcd.home = DetachedZk.home = home
    cluster: DetachedEtcd | DetachedZk
    if state["kind"] == DetachedEtcd.kind:
        etcd = DetachedEtcd.__new__(DetachedEtcd)
        etcd.root, etcd.extra_args, etcd.token, etcd.processes = home / "data", (), state["token"], {}
        etcd.client_ports, etcd.peer_ports = state["client_ports"], state["peer_ports"]
        etcd.names = list(etcd.client_ports)
        etcd.initial_cluster = ",".join(f"{n}=http://127.0.0.1:{etcd.peer_ports[n]}" for n in etcd.names)
        cluster = etcd
    else:
        zk = DetachedZk.__new__(DetachedZk)
        zk.root, zk.processes = home / "data", {}
        zk.client_ports = {int(i): port for i, port in state["client_ports"].items()}
        zk.ids = sorted(zk.client_ports)
        cluster = zk
    return cluster


def restart(home: Path, *, fresh: bool) -> None:
    cluster = rebuilt(home)
    stop(home)
    if isinstance(cluster, DetachedEtcd):
        for name in cluster.names:
            if fresh:
                shutil.rmtree(cluster.root / name)
            cluster.start(name, state="new")  # ignored by a member that has its data
        cluster.wait_healthy(timeout_s=READY_S)
        return
    for i in cluster.ids:
        if fresh:
            shutil.rmtree(cluster.root / f"zk{i}" / "version-2", ignore_errors=True)
        cluster.start(i)
    cluster.wait_serving(READY_S)


def main(argv: list[str]) -> None:
    if argv[0] == "start":
        print(start(argv[1], Path(argv[2])))
    elif argv[0] == "restart":
        restart(Path(argv[1]), fresh="--fresh" in argv)
    elif argv[0] == "stop":
        stop(Path(argv[1]))
    else:
        sys.exit(f"unknown action {argv[0]!r} (start, restart or stop)")


if __name__ == "__main__":
    main(sys.argv[1:])
