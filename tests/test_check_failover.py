"""``stockade check``'s failover case on etcd and ZooKeeper, the whole cluster restarted by a command (docs/check.md).

The coordinator is a three-member etcd cluster or a three-server ZooKeeper
ensemble of the test's own (tests/helpers/ensemble_restart.py: the fixtures'
members, each in a session of its own), and ``--coordinator-restart`` is the
helper's ``restart``: every member ended with SIGTERM, all down together, then
started again on the same data directories. The check must hold: tokens keep
rising across the restart (C1) and the holder from before is refused.

The control is the same command with ``--fresh``: the members come back with
their data directories wiped, a cluster restored from nothing. Its tokens go
back, and the check must say so and exit 1.

The stacks are those of docs/check.md's "Measured" table (etcd + Redis,
ZooKeeper + a directory); only the failover case runs here (the other cases of
those stacks are tests/test_check.py's). 2 rounds (``STOCKADE_LONG=1``: 20);
the control 1 (20).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HELPERS, python_env
from helpers.ensemble_restart import DetachedEtcd, DetachedZk
from helpers.etcd_cluster import etcd_available
from helpers.zk_ensemble import zookeeper_available

from stockade.testing.servers.redis import RedisServer, require_redis

LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = 20 if LONG else 2
CONTROL_ROUNDS = 20 if LONG else 1
SECONDS = "1200" if LONG else "300"


def helper(*args: str) -> str:
    return " ".join([shlex.quote(sys.executable), shlex.quote(str(HELPERS / "ensemble_restart.py")),
                     *map(shlex.quote, args)])


@pytest.fixture(params=[DetachedEtcd, DetachedZk], ids=lambda cls: cls.kind)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A cluster of the test's own (the helper's kinds): (kind, its url, its helper home); every member stopped
    after."""
    kind = request.param.kind
    available = etcd_available if request.param is DetachedEtcd else zookeeper_available
    if not available() and os.environ.get("CI") != "true":
        pytest.skip(f"{kind} is not installed")
    home = tmp_path / kind
    try:
        url = subprocess.run(helper("start", kind, str(home)), shell=True, check=True, capture_output=True,
                             text=True, timeout=300, env=python_env()).stdout.strip()
        yield kind, url, home
    finally:
        subprocess.run(helper("stop", str(home)), shell=True, timeout=120, env=python_env())


@pytest.fixture
def resource(cluster: tuple[str, str, Path], tmp_path: Path) -> Iterator[str]:
    """The resource of the stack in docs/check.md's table: Redis beside etcd, a directory beside ZooKeeper."""
    if cluster[0] == DetachedZk.kind:
        root = tmp_path / "files"
        root.mkdir()
        yield f"file://{root}"
        assert list(root.iterdir()) == []
        return
    require_redis()
    server = RedisServer(tmp_path / "redis")
    try:
        yield server.url
    finally:
        server.stop()


def failover_check(cluster: tuple[str, str, Path], resource: str, *, rounds: int,
                   fresh: bool) -> subprocess.CompletedProcess[str]:
    kind, url, home = cluster
    zookeeper = kind == DetachedZk.kind  # a frozen holder's scope is freed when its 2 s session expires
    coordinator = f"{url}/check" + ("?session_timeout_ms=2000" if zookeeper else "")
    restart = helper("restart", str(home), *(["--fresh"] if fresh else []))
    argv = [sys.executable, "-m", "stockade", "check", "--coordinator", coordinator, "--resource", resource,
            "--cases", "failover", "--rounds", str(rounds), "--ttl-ms", "1000" if zookeeper else "300",
            "--coordinator-restart", restart, "--seconds", SECONDS, "--quiet"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=int(SECONDS) + 300, env=python_env())
    print(result.stdout, result.stderr)
    return result


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    return next(line.split(None, 1)[1] for line in result.stdout.splitlines()
                if line.split()[:2] in (["held", "failover:"], ["BROKEN", "failover:"]))


def test_failover_whole_cluster_restarted(cluster: tuple[str, str, Path], resource: str) -> None:
    result = failover_check(cluster, resource, rounds=ROUNDS, fresh=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict(result) == (f"failover: 0 of {ROUNDS} restarts let a token go back (C1); 0 of {ROUNDS} rounds "
                               "where the holder from before won after the restart (its write applied, or the "
                               "newer one lost)")
    assert "Traceback" not in result.stderr


def test_failover_cluster_back_empty_fails(cluster: tuple[str, str, Path], resource: str) -> None:
    """The control: the restart wipes every member's data directory; the tokens go back every round."""
    result = failover_check(cluster, resource, rounds=CONTROL_ROUNDS, fresh=True)
    assert result.returncode == 1, result.stdout + result.stderr
    line = verdict(result)
    assert line.startswith(f"failover: {CONTROL_ROUNDS} of {CONTROL_ROUNDS} restarts let a token go back"), line
