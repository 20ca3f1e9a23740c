"""etcd out of space: its database reached ``--quota-backend-bytes`` and it raised the NOSPACE alarm.

From then on etcd refuses every request that writes, until an operator acts.
On a real one-member etcd with a 16 MiB quota, filled by other keys:

- a grant is refused as `BackendUnavailable`, naming the cause and the way
  out (docs/coordinator-etcd.md, "When etcd is out of space");
- a held lease is still renewed (a keepalive writes nothing); its release is
  refused (the release writes), and the lease then ends with its TTL;
- the way out the docs give works, run as they give it (etcdctl): free
  space, compact, defragment, and disarm the alarm. The control: before the
  disarm, a grant is still refused;
- after it, every scope goes on above its last token.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
from pathlib import Path

import pytest

import stockade
from stockade.core.errors import BackendUnavailable

QUOTA_BYTES = 16 * 1024 * 1024
#: Each filler key's value: well under etcd's request limit (1.5 MiB).
FILLER_BYTES = 1_000_000
#: Filler keys written before the test gives up on reaching the quota.
FILLERS_MAX = 100


@pytest.fixture
def small_etcd(tmp_path: Path):
    from helpers.etcd_cluster import EtcdCluster, etcd_available

    if not etcd_available() and os.environ.get("CI") != "true":
        pytest.skip("etcd is not installed (scripts/test.sh installs it; CI never skips)")
    cluster = EtcdCluster(tmp_path / "etcd", members=1, extra_args=("--quota-backend-bytes", str(QUOTA_BYTES)))
    try:
        yield cluster
    finally:
        cluster.stop()


def _way_out() -> list[str]:
    """The shell lines of docs/coordinator-etcd.md's way out of the NOSPACE alarm."""
    doc = (Path(__file__).parent.parent / "docs" / "coordinator-etcd.md").read_text()
    block = re.search(r"## When etcd is out of space.*?```sh\n(.*?)```", doc, re.S)
    assert block is not None, "the docs lost their way out"
    return block.group(1).strip().splitlines()


def _sh(cluster, lines: list[str]) -> None:
    done = subprocess.run(["sh", "-ec", "\n".join(lines)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": cluster.client_url("n1")})
    assert done.returncode == 0, done.stderr


def _fill(cluster) -> int:
    """Put filler keys until etcd refuses for space; how many it took."""
    for i in range(FILLERS_MAX):
        try:
            cluster.put(f"filler/{i:04d}".encode(), os.urandom(FILLER_BYTES))
        except urllib.error.HTTPError as exc:
            assert b"database space exceeded" in exc.read()
            return i
    raise AssertionError(f"etcd took {FILLERS_MAX} MB under a {QUOTA_BYTES} B quota")


def test_out_of_space_grants_are_refused_renewals_go_on_and_the_way_out_works(small_etcd) -> None:
    coord = stockade.connect(small_etcd.url)
    try:
        first = coord.acquire("a", ttl_ms=60_000, keepalive=False)
        first.release()
        held = coord.acquire("held", ttl_ms=10_000, keepalive=False)  # 3 s: filling etcd outlasted it at load 40
        assert _fill(small_etcd) > 0

        with pytest.raises(BackendUnavailable) as refused:
            coord.acquire("a", ttl_ms=60_000, wait_ms=0, keepalive=False)
        assert "database space exceeded" in str(refused.value) and "NOSPACE alarm" in str(refused.value)
        held.renew()  # a keepalive writes nothing: etcd still takes it
        with pytest.raises(BackendUnavailable, match="database space exceeded"):
            held.release()  # the release writes its event: refused, and the lease ends with its TTL

        # The way out, as the docs give it (etcdctl): free space, compact, defragment, then disarm.
        # The control: before the disarm, etcd still refuses a grant.
        steps = _way_out()
        assert steps[-1] == "etcdctl alarm disarm"
        _sh(small_etcd, steps[:-1])
        with pytest.raises(BackendUnavailable, match="database space exceeded"):
            coord.acquire("a", ttl_ms=60_000, wait_ms=0, keepalive=False)
        _sh(small_etcd, steps[-1:])

        after = coord.acquire("a", ttl_ms=60_000, wait_ms=0, keepalive=False)
        assert after.token.value > first.token.value
        after.release()
        again = coord.acquire("held", ttl_ms=60_000, wait_ms=30_000, keepalive=False)  # once its TTL ran out
        assert again.token.value > held.token.value
        again.release()
    finally:
        coord.close()
