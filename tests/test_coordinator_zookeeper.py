"""The ZooKeeper coordinator on a real three-server ZooKeeper 3.8 ensemble: its own rules, and S14.

The conformance suite runs on ZooKeeper from tests/test_coordinator_conformance.py;
this file holds what is ZooKeeper's own: the url and the TTL bound (the
negotiated session timeout), the token being the czxid and not the sequence
suffix (with the suffix's control), a suspended connection (K2), an expired
session, a client paused past its session timeout, and the acquire storm
through leader changes (S14) beside its control. FIFO order with several
waiters (C4) and the lock-delay (C5) are the conformance suite's.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, PYTHON, python_env
from helpers.zk_ensemble import CONTAINER_CHECK_MS, ZkEnsemble, zookeeper_available
from test_coordinator_etcd import _check, _grants, _wait_grants

import stockade
from stockade.coordinators.registry import Capability
from stockade.coordinators.zookeeper import check_ttl, parse_lease_id, parse_location, sequence_of

LONG = os.environ.get("STOCKADE_LONG") == "1"
LEADER_CHANGES = 20 if LONG else 2
STORM_PROCESSES = 4
STORM_SESSION_MS = 4000

pytestmark = pytest.mark.skipif(
    not zookeeper_available() and os.environ.get("CI") != "true",
    reason="ZooKeeper is not installed (CI never skips)",
)


# -- pure: url, TTL bound, lease ids ---------------------------------------------------------------


def test_url_servers_chroot_and_session_timeout():
    location = parse_location("h1:2181,h2:2182,[::1]:2183/team/a?session_timeout_ms=4000")
    assert location.hosts == (("h1", 2181), ("h2", 2182), ("::1", 2183))
    assert location.chroot == "/team/a" and location.session_timeout_ms == 4000
    assert parse_location("h1").hosts == (("h1", 2181),) and parse_location("h1").session_timeout_ms == 10_000
    for bad in ["", "h1:x", "h1:0", "h1/../x", "user@h1", "h1?ttl=1", "h1?session_timeout_ms=10",
                "h1?session_timeout_ms=x", "h1/a b"]:
        with pytest.raises(stockade.InvalidArgument):
            parse_location(bad)
    with pytest.raises(stockade.InvalidArgument, match="lock_delay_ms"):
        stockade.connect("zookeeper://127.0.0.1:9", lock_delay_ms=-1)  # refused before any I/O
    with pytest.raises(stockade.InvalidArgument):
        stockade.connect("zk://127.0.0.1:9", auth_token="t")


def test_ttl_is_bounded_by_the_session_timeout():
    assert check_ttl(4000, 4000) == 4000 and check_ttl(1, 4000) == 1
    for ttl_ms in (4001, 0, 3_600_001):
        with pytest.raises(stockade.InvalidArgument):
            check_ttl(ttl_ms, 4000)
    assert parse_lease_id("4294967309.0000000007.a.b") == (4294967309, "0000000007", "a.b")
    assert parse_lease_id("4294967309.-000000001.a") == (4294967309, "-000000001", "a")
    for bad in ["", "x.0000000001.a", "1.01.a", "1.0000000001.", "1.0000000001.a/b", None]:
        assert parse_lease_id(bad) is None
    assert sequence_of("n-0000000012") == 12 and sequence_of("n--000000001") == -1 and sequence_of("x") is None


# -- on the session's ensemble ---------------------------------------------------------------------


@pytest.fixture
def url(zk_ensemble, tmp_path) -> str:
    return f"{zk_ensemble.url}/{tmp_path.name}"


def _kazoo(ensemble: ZkEnsemble, **options):
    from kazoo.client import KazooClient

    client = KazooClient(hosts=ensemble.hosts, **options)
    client.start(30)
    return client


def test_ttl_above_the_negotiated_session_timeout_is_refused(url):
    coord = stockade.connect(url + "?session_timeout_ms=2000")
    with pytest.raises(stockade.InvalidArgument, match="session timeout"):
        coord.acquire("long", ttl_ms=2001)
    assert coord.inspect("long").state is stockade.ScopeState.FREE and coord.last_issued("long") == 0
    coord.acquire("long", ttl_ms=2000).release()  # the session's own timeout is fine
    # What the server negotiated (within its 1..60 s bounds here) is what bounds the TTL.
    assert coord._port._session.negotiated_ms == 2000
    coord.close()


def test_token_is_the_czxid_with_the_epoch_in_its_high_bits(url, zk_ensemble, tmp_path):
    coord = stockade.connect(url)
    assert Capability.DENSE_TOKENS not in coord.capabilities and Capability.NATIVE_WAIT in coord.capabilities
    lease = coord.acquire("czxid", ttl_ms=2000)
    path = f"/{tmp_path.name}/stockade/q/czxid/n-{lease.lease_id.split('.')[1]}"
    client = _kazoo(zk_ensemble)
    try:
        stat = client.exists(path)
        assert stat.czxid == lease.token.value and stat.ephemeralOwner == coord._port._session.session_id
        assert lease.token.value >> 32 >= 1  # the leader's epoch (1 or more) in the high 32 bits
        store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id,
                                    keys=stockade.connect(url).verify_keys())
        store.put("czxid", "k", b"v", token=lease.token)  # verified with another client's copy of the keyring
    finally:
        client.stop()
        client.close()
    lease.release()
    coord.close()


def test_sequence_suffix_is_a_32_bit_counter_that_restarts_with_its_container(zk_ensemble, tmp_path):
    """The two facts that make the sequence suffix unfit as a token, shown on the server."""
    from kazoo.protocol.states import ZnodeStat

    from stockade.coordinators.zookeeper import parse_location as parse
    from stockade.coordinators.zookeeper.session import ZkSession

    # The suffix is the parent's cversion, which ZooKeeper's wire format carries as a signed int32.
    assert ZnodeStat._fields.index("cversion") == 5
    from kazoo.protocol.serialization import stat_struct
    assert stat_struct.format.lstrip("!")[5] == "i"  # int32: it wraps at 2**31
    session = ZkSession(parse(f"{zk_ensemble.hosts}"), connect_timeout_ms=30_000)
    client = session.client
    client.start(30)
    parent = f"/{tmp_path.name}-seq"
    try:
        client.ensure_path("/")
        session.create_container_async(parent).get(30)
        first = [client.create(parent + "/n-", ephemeral=True, sequence=True, include_data=True) for _ in range(3)]
        assert [p.rsplit("-", 1)[1] for p, _ in first] == ["0000000000", "0000000001", "0000000002"]
        assert client.exists(parent).cversion == 3  # the counter the suffix came from
        for p, _ in first:
            client.delete(p)
        deadline = time.monotonic() + 30
        while client.exists(parent) is not None:  # the server deletes the emptied container
            assert time.monotonic() < deadline, "the container was not deleted"
            time.sleep(CONTAINER_CHECK_MS / 1000 / 3)
        session.create_container_async(parent).get(30)
        again, stat = client.create(parent + "/n-", ephemeral=True, sequence=True, include_data=True)
        assert again.rsplit("-", 1)[1] == "0000000000"  # the suffix restarted ...
        assert stat.czxid > max(s.czxid for _, s in first)  # ... the czxid did not
    finally:
        session.close()


def _acquire_into(coord: Any, out: list[Any]) -> None:
    out.append(coord.acquire("seq", ttl_ms=5000, wait_ms=30_000))


def test_control_the_sequence_suffix_as_token_goes_back_after_the_container_is_deleted(url, zk_ensemble, tmp_path):
    coord, second = stockade.connect(url), stockade.connect(url)
    # keys="unsigned": the control's tokens are made from the suffix, without a MAC; it shows their order only.
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id, keys="unsigned")
    client = _kazoo(zk_ensemble)
    queue = f"/{tmp_path.name}/stockade/q/seq"
    outcomes: dict[str, list[str]] = {"czxid": [], "sequence": []}

    def write(lease: Any) -> None:
        sequence = int(lease.lease_id.split(".")[1]) + 1
        for source, value in (("czxid", lease.token.value), ("sequence", sequence)):
            token = stockade.FencingToken(coord.cluster_id, f"seq-{source}", value)
            try:
                store.put(f"seq-{source}", "k", str(value).encode(), token=token)
                outcomes[source].append("ok")
            except stockade.StaleToken:
                outcomes[source].append("stale")

    try:
        for _ in range(2):
            # Two holders a round, the second queued behind the first: the container is never empty inside
            # a round, so the server cannot delete it between them however slow the host (suffixes 1, 2).
            first = coord.acquire("seq", ttl_ms=5000)
            queued: list[Any] = []
            waiter = threading.Thread(target=_acquire_into, args=(second, queued))
            waiter.start()
            deadline = time.monotonic() + 30
            while len(client.get_children(queue)) < 2:  # the second's node is in the queue
                assert time.monotonic() < deadline, "the second acquire did not queue"
                time.sleep(0.01)
            write(first)
            first.release()
            waiter.join(30)
            assert queued, "the queued acquire was not granted"
            write(queued[0])
            queued[0].release()
            deadline = time.monotonic() + 30
            while client.exists(queue) is not None:  # emptied: the server deletes the container
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        client.stop()
        client.close()
    assert outcomes["czxid"] == ["ok"] * 4
    assert outcomes["sequence"] == ["ok", "ok", "stale", "ok"], outcomes  # a new holder refused: caught
    coord.close()
    second.close()


def test_an_expired_session_ends_every_lease_on_it(url, zk_ensemble):
    coord = stockade.connect(url)
    leases = [coord.acquire(f"e{i}", ttl_ms=3000) for i in range(3)]
    kept = stockade.connect(url)
    control = kept.acquire("e-control", ttl_ms=3000)
    # Another connection with the same session id and password, closed: the server expires the session.
    session_id, password = coord._port._session.client.client_id
    twin = _kazoo(zk_ensemble, client_id=(session_id, password))
    twin.stop()
    twin.close()
    for lease in leases:
        assert lease.wait_lost(timeout_ms=10_000), "a lease outlived its session"
    other = stockade.connect(url)
    for i, lease in enumerate(leases):
        taken = other.acquire(f"e{i}", ttl_ms=3000, wait_ms=5000)  # the nodes went with the session
        assert taken.token.value > lease.token.value
        taken.release()
    assert not control.lost  # control: a lease on another session is untouched
    control.release()
    for handle in (coord, kept, other):
        handle.close()


def test_suspended_connection_marks_the_lease_lost_by_its_local_deadline(private_zk_ensemble, tmp_path):
    zk_ensemble = private_zk_ensemble  # every server of it is stopped
    coord = stockade.connect(f"{zk_ensemble.url}/{tmp_path.name}", timeout_ms=800)
    for attempt in range(3):  # a busy host can take the whole TTL to grant: the set-up, not the claim
        try:
            lease = coord.acquire(f"k2-{attempt}", ttl_ms=1000)
            kept = coord.acquire(f"k2-control-{attempt}", ttl_ms=1000)
            break
        except stockade.LeaseLost:
            continue
    else:
        pytest.fail("3 of 3 set-ups lost a 1 s lease while it was granted")
    time.sleep(1.2)
    assert not kept.lost  # control: with the ensemble up, the keepalive holds a lease past its TTL
    assert not lease.lost  # lost only by the pause below, or the claim would hold vacuously
    paused_ns = time.monotonic_ns()
    for i in zk_ensemble.ids:
        zk_ensemble.pause(i)
    try:
        assert lease.wait_lost(timeout_ms=5000)
        lost_after_ms = (time.monotonic_ns() - paused_ns) // 1_000_000
        assert lost_after_ms <= 1000 + 400, lost_after_ms  # by the local deadline, not the session's end
    finally:
        for i in zk_ensemble.ids:
            zk_ensemble.resume(i)
    coord.close()


def test_a_client_paused_past_its_session_timeout_has_its_writes_rejected(url, tmp_path):
    """The pause case of `stockade check` on a 2 s session (`paused_holder_check`), beside its control: the same
    worker writing through a store with its fence swapped out."""
    from test_check import ROUNDS, paused_holder_check

    session = "?session_timeout_ms=2000"
    out, status = paused_holder_check(url + session, tmp_path / "fenced", ttl_ms="1000")
    assert status == 0 and f"held    pause: 0 of {ROUNDS} stale writes applied" in out, out
    out, status = paused_holder_check(url + "-control" + session, tmp_path / "control", "--control", "fencing-off",
                                      ttl_ms="1000")
    assert status == 1 and f"BROKEN  pause: {ROUNDS} of {ROUNDS} stale writes applied" in out, out  # they get in


def test_cli_status_and_lock_on_zookeeper(url, tmp_path):
    coord = stockade.connect(url)
    lease = coord.acquire("cli", ttl_ms=5000, holder="cli-holder")
    status = subprocess.run([PYTHON, "-m", "stockade", "status", "--url", url, "--json"],
                            capture_output=True, text=True, env=python_env(), timeout=60)
    assert status.returncode == 0, status.stderr
    assert '"holder": "cli-holder"' in status.stdout and f'"token": {lease.token.value}' in status.stdout
    lease.release()
    locked = subprocess.run(
        [PYTHON, "-m", "stockade", "lock", "--url", url, "--ttl-ms", "5000", "--data-dir", str(tmp_path), "cli",
         "--", PYTHON, "-c", "import os; print(os.environ['STOCKADE_TOKEN'])"],
        capture_output=True, text=True, env=python_env(), timeout=60,
    )
    assert locked.returncode == 0, locked.stderr
    assert locked.stdout.startswith(f"stk2.{coord.cluster_id}.")
    assert coord.last_issued("cli") > lease.token.value
    coord.close()


def test_serve_coordinator_zookeeper(serve, url):
    """``stockade serve --coordinator zookeeper://...``: the HTTP API in front of the ensemble."""
    server = serve("--coordinator", url)
    direct = stockade.connect(url)
    with stockade.connect(server.url) as coord:
        assert coord.cluster_id == direct.cluster_id  # the ensemble's cluster id and keyring
        lease = coord.acquire("served", ttl_ms=3000, holder="through-http")
        shown = direct.inspect("served")
        assert shown.holder == "through-http" and shown.token.value == lease.token.value  # the czxid
        waiter = threading.Thread(target=lambda: coord.acquire("served", ttl_ms=3000, wait_ms=20_000).release())
        waiter.start()
        deadline = time.monotonic() + 20
        while direct.inspect("served").waiters < 1:  # a watch in the server, not a poll
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lease.release()
        waiter.join(30)
        assert not waiter.is_alive() and direct.last_issued("served") > lease.token.value
    direct.close()


def test_async_client_opened_inside_a_running_loop_does_not_block_it(url):
    import asyncio

    async def body() -> tuple[str, int, int]:
        coord = stockade.connect_async(url)  # nothing blocks here: the session starts on the first await
        with pytest.raises(stockade.InvalidArgument):
            _ = coord.cluster_id
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.ensure_future(ticker())
        async with coord:
            lease = await coord.acquire("in-loop", ttl_ms=1000)
            waiter = asyncio.ensure_future(coord.acquire("in-loop", ttl_ms=1000, wait_ms=5000))
            await asyncio.sleep(0.3)  # the waiter's watch waits without holding the loop
            before = ticks
            await lease.release()
            second = await waiter
            await second.release()
        stop.set()
        await task
        return coord.cluster_id, second.token.value - lease.token.value, before

    cluster_id, step, ticks = asyncio.run(body())
    assert cluster_id == stockade.connect(url).cluster_id and step > 0
    assert ticks >= 20  # the loop kept running while requests and the watch were out


# -- S14: the acquire storm through leader changes, on an ensemble of its own ----------------------


@pytest.fixture
def own_ensemble(private_zk_ensemble):
    """An ensemble no other worker uses: its leader is killed and paused, and it is whole again afterwards."""
    yield private_zk_ensemble
    for i in private_zk_ensemble.ids:
        private_zk_ensemble.resume(i)
        if private_zk_ensemble.processes[i].poll() is not None:
            private_zk_ensemble.start(i)
    private_zk_ensemble.wait_serving()  # every server answers again before the next test


def _storm(ensemble: ZkEnsemble, tmp_path: Path, changes: int, mutant: str = "", grants_min: int = 8) -> dict:
    """Run the storm through ``changes`` leader faults; the figures of the etcd storm's checks."""
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    url = f"{ensemble.url}/{tmp_path.name}?session_timeout_ms={STORM_SESSION_MS}"
    coord = stockade.connect(url)
    keys = "unsigned" if mutant else coord.verify_keys()  # the control's made-up tokens carry no MAC
    stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=keys).close()  # created once, first
    coord.close()
    logs = [tmp_path / f"worker{i}.log" for i in range(STORM_PROCESSES)]
    workers = []
    for index, log in enumerate(logs):
        with open(log, "wb") as out:
            argv = [PYTHON, str(HELPERS / "failover_storm.py"), url, store_url, str(index)]
            workers.append(subprocess.Popen(
                argv + ([mutant] if mutant else []), stdout=out, stderr=subprocess.STDOUT, env=python_env()
            ))
    faults: list[int] = []
    changed = 0
    try:
        for index in range(changes):
            ensemble.wait_ready()
            _wait_grants(logs, len(faults) * 4 + 8, workers)
            leader = ensemble.leader()
            faults.append(time.monotonic_ns())
            if index % 2 == 0:
                ensemble.kill(leader)
                new_leader = ensemble.leader(other_than=leader)
                ensemble.start(leader)
            else:
                ensemble.pause(leader)
                time.sleep(STORM_SESSION_MS / 1000 + 0.5)  # past the session timeout
                new_leader = ensemble.leader(other_than=leader)
                ensemble.resume(leader)
            changed += new_leader != leader
        ensemble.wait_ready()
        _wait_grants(logs, max(grants_min, len(faults) * 4 + 8), workers)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
    texts = [log.read_text() for log in logs]
    figures = _check(texts, faults)
    figures["leader_changes"] = changed
    figures["median_to_new_epoch_grant_ms"] = _to_new_epoch_ms(texts, faults)
    return figures


def _to_new_epoch_ms(texts: list[str], faults: list[int]) -> float | None:
    """The median time from a leader's fault to the first grant whose token (czxid) carries a
    newer epoch than any before the fault: a grant the next leader wrote."""
    grants = sorted(_grants(texts), key=lambda g: g[2])
    times = []
    for fault in faults:
        epoch = max((token >> 32 for _, token, t, _ in grants if t <= fault), default=0)
        after = [t for _, token, t, _ in grants if t > fault and token >> 32 > epoch]
        if after:
            times.append((min(after) - fault) / 1e6)
    return statistics.median(times) if times else None


def test_s14_acquire_storm_through_leader_changes(own_ensemble, tmp_path):
    figures = _storm(own_ensemble, tmp_path, LEADER_CHANGES)
    print(f"S14 zookeeper: {figures}")
    assert figures["leader_changes"] == LEADER_CHANGES, figures
    assert figures["regressions"] == 0 and figures["duplicates"] == 0 and figures["stale_accepted"] == 0, figures
    assert figures["grants"] >= LEADER_CHANGES * 4, figures


def test_s14_control_the_sequence_suffix_as_token_is_caught(own_ensemble, tmp_path):
    figures = _storm(own_ensemble, tmp_path, 0, mutant="sequence", grants_min=48)
    print(f"S14 control: {figures}")
    # emptied containers are deleted and suffixes start again: a scope's token repeats or goes down
    assert figures["regressions"] > 0, figures


# -- standing again right after the session expired ------------------------------------------------

PAUSED_ELECTIONS = 3
PAUSED_SESSION_MS = 1000


def _paused_elector(url: str, mutant: str, out: dict[str, list[str]]) -> None:
    """A leader on a 1 s session is SIGSTOPped for 3.5 s (its session expires), resumed, and stands again at
    once: with ``wait_ms`` 10 s, then 0 (bounded by the request timeout). ``out[mutant]``: what each got."""
    argv = [PYTHON, str(HELPERS / "zk_paused_elector.py"), f"{url}?session_timeout_ms={PAUSED_SESSION_MS}"]
    child = subprocess.Popen(argv + ([mutant] if mutant else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=python_env(), text=True)
    got = out.setdefault(mutant, [])
    try:
        assert child.stdin is not None and child.stdout is not None
        for index in range(PAUSED_ELECTIONS):
            child.stdin.write(f"{10_000 if index % 2 == 0 else 0}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "leader"
            child.send_signal(signal.SIGSTOP)
            time.sleep(3.5)  # the ensemble expires the session (1 s, checked every tick of 500 ms)
            child.send_signal(signal.SIGCONT)
            child.stdin.write("go\n")
            child.stdin.flush()
            got.append(child.stdout.readline().strip())
        child.stdin.close()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait(10)


def test_elect_right_after_the_session_expired_waits_for_the_next_session(url):
    """Beside its control (one attempt, the old behaviour), paused in the same way at the same time."""
    out: dict[str, list[str]] = {}
    runs = [threading.Thread(target=_paused_elector, args=(url + suffix, mutant, out))
            for suffix, mutant in (("", ""), ("-control", "control"))]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    print(f"elect right after the session expired: {out}")
    assert out[""] == ["elected True"] * PAUSED_ELECTIONS  # a new session each time, and elected on it
    assert out["control"].count("unavailable") >= 1, out  # control: BackendUnavailable until kazoo reconnects
