"""The sharded key-value example (examples/shardkv, docs/shard-log.md) on a real PostgreSQL.

- The router finds each shard's writer through the election API (`coord.leader`,
  `coord.watch_leader`), in-process and with ``router.py leaders``.
- The example run: 8 shards, 3 storage nodes, writers elected with
  `coord.elect`, failovers in turn by kill -9, SIGSTOP at a random moment, and
  a freeze (the writer stops itself between its check of ``lost`` and its
  append); acknowledged appends lost, duplicated, gaps, out of order and stale
  appends accepted all 0, one digest on every node, every shard linearizable,
  every leader the coordinator showed is the writer whose appends carry its term.
- Control, which must fail: the same run on a database whose fence accepts
  every token (``fencing-off``): each frozen writer's append is accepted after
  its successor's, and the run fails.

``STOCKADE_LONG=1`` runs 24 failovers (8 of each kind) and 8 control freezes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import stockade
from stockade.recipes._log_postgres import install_log
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.testing.servers.postgres import PostgresServer, available

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "shardkv"
LONG = os.environ.get("STOCKADE_LONG") == "1"
FAILOVERS = 24 if LONG else 3
CONTROL_FREEZES = 8 if LONG else 2
RUN_TIMEOUT_S = 1_800

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

sys.path.insert(0, str(EXAMPLE))
import router  # noqa: E402  (the example's module, beside its scripts)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def run_example(url: str, workdir: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run([sys.executable, str(EXAMPLE / "run.py"), "--url", url, "--workdir", str(workdir), *args],
                          capture_output=True, text=True, env=child_env(), timeout=RUN_TIMEOUT_S)
    assert done.returncode in (0, 1) and done.stdout.strip(), done.stderr[-3000:]
    print(done.stderr[-6000:])  # one line per failover: who led, who leads now, the time to the first ack
    report = json.loads(done.stdout)
    print(json.dumps(report))
    return done.returncode, report, done.stderr


def test_the_router_finds_each_shards_writer_through_the_election(pg_db: tuple[PostgresServer, str]) -> None:
    server, name = pg_db
    url = server.url(name)
    with stockade.connect(url) as coord, stockade.connect(url) as other:
        assert router.leaders(coord, 2) == {"kv.shard-0": None, "kv.shard-1": None}
        first = coord.elect("kv.shard-1", ttl_ms=10_000, identity="w1")
        shown = router.leaders(coord, 2)
        assert shown["kv.shard-0"] is None and shown["kv.shard-1"] is not None
        assert (shown["kv.shard-1"].holder, shown["kv.shard-1"].term) == ("w1", first.term)
        cli = subprocess.run([sys.executable, str(EXAMPLE / "router.py"), "leaders", "--url", url, "--shards", "2"],
                             capture_output=True, text=True, env=child_env(), timeout=120)
        assert cli.returncode == 0, cli.stderr
        lines = cli.stdout.splitlines()
        assert lines[0] == "kv.shard-0 - - -" and lines[1].split()[:3] == ["kv.shard-1", "w1", str(first.term)]
        # A waiting candidate is elected when the leader resigns; next_leader sees the later term.
        won: list[Any] = []
        standing = threading.Thread(target=lambda: won.append(
            other.elect("kv.shard-1", ttl_ms=10_000, wait_ms=60_000, identity="w2")))
        standing.start()
        first.resign()
        seen = router.next_leader(coord, "kv.shard-1", after_term=first.term, timeout_ms=60_000)
        standing.join()
        assert seen is not None and (seen.holder, seen.term) == ("w2", won[0].term) and seen.term > first.term
        assert router.next_leader(coord, "kv.shard-1", after_term=seen.term, timeout_ms=200) is None  # no later term
        won[0].resign()


def test_the_sharded_kv_example_survives_writer_failovers(pg_db: tuple[PostgresServer, str], tmp_path: Path) -> None:
    server, name = pg_db
    code, report, log = run_example(server.url(name), tmp_path / "run", "--shards", "8", "--nodes", "3",
                                    "--failovers", str(FAILOVERS))
    assert sum(report["failovers"].values()) == FAILOVERS and log.count("failover ") == FAILOVERS
    assert (report["acknowledged_lost"], report["duplicated"], report["gaps"], report["out_of_order"],
            report["stale_accepted"]) == (0, 0, 0, 0, 0), report
    assert report["acknowledged"] > 0
    assert report["node_digests"] == 1 and report["nodes_match_logs"] == report["nodes"] == 3
    assert report["linearizable"] and not report["linearizability_undecided"], report
    # The election as the router sees it matches the writers: one holder per term, the one that appends.
    assert report["leader_mismatches"] == 0 and report["leaders_unconfirmed"] == 0
    assert report["leaders_observed"] >= FAILOVERS + min(FAILOVERS, 8)  # each failover's successor, each shard's first
    # A frozen writer's next append is sent after its successor's first, with its old token: refused, every time.
    freezes = report["zombie_appends"]["freeze"]
    assert freezes["refused"] == report["failovers"]["freeze"] and freezes["accepted"] == 0
    assert report["zombie_appends"]["pause"]["accepted"] == 0
    assert report["passed"] and code == 0


def test_control_the_example_with_fencing_off_lets_the_frozen_writers_in(
    pg_db: tuple[PostgresServer, str], tmp_path: Path,
) -> None:
    server, name = pg_db
    url = server.url(name)
    with stockade.connect(url) as coord, psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
        keyring, cluster = pg._keyring_of(coord.verify_keys(), None)
        pg._install(conn, keyring, cluster, q.STALE_WHEN["fencing-off"])  # the fence accepts every token
        install_log(conn)
    code, report, _ = run_example(url, tmp_path / "run", "--installed", "--shards", "2", "--nodes", "1",
                                  "--kinds", "freeze", "--failovers", str(CONTROL_FREEZES),
                                  "--pause-append-wait-s", "30")
    print(f"control, fencing off: frozen writers' appends accepted after their successor's: "
          f"{report['zombie_appends']['freeze']['accepted']} of {CONTROL_FREEZES}")
    assert report["zombie_appends"]["freeze"]["accepted"] == CONTROL_FREEZES
    assert report["stale_accepted"] >= CONTROL_FREEZES
    assert not report["passed"] and code == 1
