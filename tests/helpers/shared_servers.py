"""One etcd cluster and one ZooKeeper ensemble for a whole pytest-xdist run, not one per worker.

Idle, the three members of each cost together about 1.7 % of a core (etcd's
heartbeats, the JVMs' timers), and a ZooKeeper ensemble about 2 s of CPU to
start: with six workers each holding both for the whole run, that was about a
minute of the default run's 2-core time. So, in a run with workers:

- the controller makes the run's shared directory and hands it to every worker
  (`pytest_configure_node` in tests/conftest.py); its reaper ends whatever the
  ``pids.json`` files there list if the controller is killed, and
  `stop_shared` ends them when the run ends;
- the first worker whose test needs a cluster starts it there under a file lock
  (`ensemble_restart.start`: each member detached, in a session of its own,
  its pid and start time recorded), and every worker attaches to it from its
  ``cluster.json``. Tests keep apart by namespace (etcd) or chroot (ZooKeeper),
  named after their directory, which is unique across workers (`tmp_path` in
  tests/conftest.py).

A test that pauses, kills or restarts members cannot do that to a cluster other
workers' tests are using: it takes one of its own (`private_zk_ensemble`, or a
cluster it starts itself). A run without workers keeps the per-process
clusters of tests/helpers/etcd_cluster.py and tests/helpers/zk_ensemble.py.
"""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from helpers import ensemble_restart
from helpers.ensemble_restart import DetachedEtcd, DetachedZk
from helpers.etcd_cluster import EtcdCluster
from helpers.zk_ensemble import ZkEnsemble

from stockade.testing.servers import reaper

KINDS = (DetachedEtcd.kind, DetachedZk.kind)


def prepare(root: Path) -> None:
    """The controller's part at the start: the directory, and its reaper told where the members will be listed."""
    root.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        reaper.watch_file(str(root / kind / "pids.json"))


def attach(kind: str, root: Path) -> EtcdCluster | ZkEnsemble:
    """The run's cluster of ``kind``, started by the first worker that asks (the others wait on the lock)."""
    home = root / kind
    with open(root / f"{kind}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not (home / "cluster.json").exists():
            ensemble_restart.start(kind, home)  # returns once every member serves; cluster.json written last
    return ensemble_restart.rebuilt(home)


def stop_shared(root: Path) -> None:
    """The controller's part at the end: every member any worker started, ended by its recorded pid."""
    for kind in KINDS:
        if (root / kind).exists():
            ensemble_restart.stop(root / kind)
    shutil.rmtree(root, ignore_errors=True)
