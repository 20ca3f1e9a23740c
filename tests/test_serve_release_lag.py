"""`stockade serve` answers a release before its commit (``--release-lag-ms``): what a kill -9 then does (C3).

Real `stockade serve` processes, killed with a real SIGKILL and started again on the same data:

- a release acknowledged and not yet committed is lost by a kill -9: after the restart its lease is held
  (C3: a full TTL from the restart), an acquire with no wait is refused, and the scope is granted only once
  that TTL has passed, with a token above the old one; the journal has the grant and not the release. The lag
  is a minute there, so that the kill surely comes first; the control, ``--release-lag-ms 0`` (a release
  answered only once committed), finds the scope free at once after the same kill;
- a grant that follows a release is committed with it, in order: killed right after the grant's answer, the
  restarted server has both (the new holder's lease and token, the old lease gone), for a grant to the next
  request and for a grant to a waiter queued behind the released lease;
- a read (``GET /v1/locks/{scope}``) and a graceful stop (SIGTERM) commit a deferred release at once.

Ordered, not timed: each kill follows the answer it is about; the one time bound is a lower one (the lease
held after the restart is not granted before its TTL from the moment the restart began).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conftest import HELPERS

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, request, start_server  # noqa: E402

TTL_MS = 1_500
LAG_MINUTE = ("--release-lag-ms", "60000")  # no deferred release commits by itself within a test


def _acquire(proc: ServerProcess, scope: str, holder: str, wait_ms: int = 0) -> tuple[int, dict[str, Any]]:
    status, _, body = request(proc.url, "POST", f"/v1/locks/{scope}/acquire",
                              json_body={"ttl_ms": TTL_MS, "wait_ms": wait_ms, "holder": holder})
    return status, json.loads(body)


def _release(proc: ServerProcess, lease_id: str) -> int:
    return request(proc.url, "DELETE", f"/v1/leases/{lease_id}")[0]


def _lock(proc: ServerProcess, scope: str) -> dict[str, Any]:
    status, _, body = request(proc.url, "GET", f"/v1/locks/{scope}")
    assert status == 200, body
    return json.loads(body)


def _kinds(proc: ServerProcess, scope: str) -> list[str]:
    status, _, body = request(proc.url, "GET", f"/v1/locks/{scope}/history")
    assert status == 200, body
    return [event["kind"] for event in json.loads(body)["events"]]


def _lost_release_round(data: Path, *lag: str) -> dict[str, Any]:
    """Acquire, release (204), kill -9 at once; restart: what the scope is then, and when it is granted again."""
    first = start_server(data, *lag)
    try:
        status, grant = _acquire(first, "a", "first")
        assert status == 200, grant
        assert _release(first, grant["lease_id"]) == 204
    finally:
        first.kill9()
    restart_began = time.monotonic()
    second = start_server(data)
    try:
        out: dict[str, Any] = {"lock": _lock(second, "a"), "journal": _kinds(second, "a")}
        status, refused = _acquire(second, "a", "next")
        out["no_wait"] = status, refused.get("type", "").rsplit("/", 1)[-1]
        status, regrant = _acquire(second, "a", "next", wait_ms=10 * TTL_MS)
        out["granted_after_ms"] = (time.monotonic() - restart_began) * 1000
        assert status == 200, regrant
        out["token_above"] = regrant["token_value"] > grant["token_value"]
        out["renew_old"] = request(second.url, "POST", f"/v1/leases/{grant['lease_id']}/renew")[0]
        return out
    finally:
        assert second.stop() == 0, second.logs()[-2000:]


def test_an_acknowledged_release_lost_by_kill_9_leaves_the_lease_held_a_ttl_from_the_restart(tmp_path: Path) -> None:
    out = _lost_release_round(tmp_path / "data", *LAG_MINUTE)
    print(f"\nrelease answered, kill -9 before its commit: {out}")
    lock = out["lock"]
    assert lock["state"] == "held" and lock["holder"] == "first" and 0 < lock["remaining_ms"] <= TTL_MS, lock
    assert out["journal"] == ["grant"]  # the release was never committed: the journal does not have it
    assert out["no_wait"] == (409, "lock-timeout"), out
    assert out["granted_after_ms"] >= TTL_MS, out  # C3: not before a full TTL from the restart
    assert out["token_above"], out
    assert out["renew_old"] == 410, out  # the lost release's lease expired; nobody holds it now


def test_control_a_release_answered_once_committed_survives_the_kill_9(tmp_path: Path) -> None:
    out = _lost_release_round(tmp_path / "data", "--release-lag-ms", "0")
    print(f"\ncontrol, --release-lag-ms 0: {out}")
    assert out["lock"]["state"] == "free" and out["journal"] == ["grant", "release"], out
    assert out["no_wait"][0] == 200 and out["granted_after_ms"] < 10 * TTL_MS, out


def test_a_grant_after_a_release_commits_both_before_its_answer(tmp_path: Path) -> None:
    """The next request's grant, then a waiter's: each answered grant has its release before it, on disk."""
    data = tmp_path / "data"
    first = start_server(data, *LAG_MINUTE)
    try:
        status, old = _acquire(first, "b", "first")
        assert status == 200 and _release(first, old["lease_id"]) == 204
        status, new = _acquire(first, "b", "second")
        assert status == 200, new
    finally:
        first.kill9()  # right after the grant's answer
    second = start_server(data, *LAG_MINUTE)
    try:
        lock = _lock(second, "b")
        assert (lock["holder"], lock["token_value"], lock["last_token"]) == ("second", new["token_value"],
                                                                              new["token_value"]), lock
        assert new["token_value"] > old["token_value"]
        assert _kinds(second, "b") == ["grant", "release", "grant"]
        assert request(second.url, "POST", f"/v1/leases/{old['lease_id']}/renew")[0] == 410
        # A waiter queued behind the lease is granted by its release, in the same turn: one commit has both.
        status, held = _acquire(second, "c", "holder")
        assert status == 200
        waited: dict[str, Any] = {}

        def wait() -> None:
            waited["status"], waited["doc"] = _acquire(second, "c", "waiter", wait_ms=60_000)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 30
        while _lock(second, "c")["waiters"] != 1:  # queued (a read: nothing deferred is pending here)
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        assert _release(second, held["lease_id"]) == 204
        waiter.join(60)
        assert waited["status"] == 200, waited
    finally:
        second.kill9()  # right after the waiter's grant was answered
    third = start_server(data)
    try:
        lock = _lock(third, "c")
        assert (lock["holder"], lock["token_value"]) == ("waiter", waited["doc"]["token_value"]), lock
        assert waited["doc"]["token_value"] > held["token_value"]
        assert _kinds(third, "c") == ["grant", "release", "grant"]
    finally:
        assert third.stop() == 0, third.logs()[-2000:]


def test_a_read_and_a_graceful_stop_commit_a_deferred_release(tmp_path: Path) -> None:
    """A read answers only once what it saw is durable, a deferred release included: a kill -9 after it keeps
    the release. SIGTERM commits what is deferred before the server exits."""
    data = tmp_path / "data"
    first = start_server(data, *LAG_MINUTE)
    try:
        status, grant = _acquire(first, "read", "first")
        assert status == 200 and _release(first, grant["lease_id"]) == 204
        assert _lock(first, "read")["state"] == "free"
    finally:
        first.kill9()  # after the read's answer
    second = start_server(data, *LAG_MINUTE)
    try:
        status, grant = _acquire(second, "stopped", "first")
        assert status == 200 and _release(second, grant["lease_id"]) == 204
    finally:
        assert second.stop() == 0, second.logs()[-2000:]  # SIGTERM right after the release's answer
    third = start_server(data)
    try:
        for scope in ("read", "stopped"):
            assert _lock(third, scope)["state"] == "free", scope
            assert _kinds(third, scope) == ["grant", "release"], scope
    finally:
        assert third.stop() == 0, third.logs()[-2000:]
