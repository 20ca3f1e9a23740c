"""The P1–P7 and P9 checkers: each passes a good history and flags the matching broken one."""

from __future__ import annotations

import io

from stockade.testing.checkers import check
from stockade.testing.history import History, dump_jsonl, load_jsonl, pair

CLUSTER = "00000000000000aa"


def tok(value: int, scope: str = "a", cluster: str = CLUSTER) -> str:
    return f"stk1.{cluster}.{value}.{scope}"


class Builder:
    """Write histories by hand: each call is one whole operation with its interval."""

    def __init__(self) -> None:
        self.h = History()

    def op(self, process, f, start, end, outcome="ok", **fields):
        completion = {k: fields.pop(k) for k in ("error", "high_water", "result_value") if k in fields}
        self.h.invoke(start, process, f, **fields)
        if "result_value" in completion:
            completion["value"] = completion.pop("result_value")
        if outcome is not None:
            self.h.complete(end, process, outcome, **completion)
        return self

    def acquire(self, process, start, end, token, scope="a", outcome="ok"):
        self.h.invoke(start, process, "acquire", scope=scope)
        self.h.complete(end, process, outcome, token=tok(token, scope) if outcome == "ok" else None)
        return self

    def write(self, process, start, end, token, value, scope="a", key="k", outcome="ok", **extra):
        return self.op(process, "write", start, end, outcome, scope=scope, key=key, token=tok(token, scope),
                       value=value, idempotency_key=value, **extra)

    def read(self, process, start, end, value, scope="a", key="k"):
        self.h.invoke(start, process, "read", scope=scope, key=key, final=process == "final" or None)
        self.h.complete(end, process, "ok", value=value)
        return self

    @property
    def records(self):
        return self.h.records


def props(result):
    return sorted(v.property for v in result.violations)


def test_good_history_has_no_violations():
    b = Builder()
    b.acquire(1, 0, 10, 1).write(1, 11, 20, 1, "v1").write(1, 21, 30, 1, "v2")
    b.acquire(2, 40, 50, 2).write(1, 45, 60, 1, "z", outcome="fail", error="stale-token", high_water=2)
    b.write(2, 51, 55, 2, "v3").read("final", 100, 101, "v3")
    audit = [("a", 1, "v1", 1), ("a", 1, "v2", 2), ("a", 2, "v3", 3)]
    result = check(b.records, audit=audit, issued=[("a", 1), ("a", 2)], cluster=CLUSTER)
    assert result.ok, str(result)
    assert result.figures["outcomes"]["write"] == {"ok": 3, "fail": 1}


def test_p1_duplicate_and_regressing_tokens():
    b = Builder().acquire(1, 0, 10, 5).acquire(2, 20, 30, 5).acquire(3, 40, 50, 4)
    result = check(b.records)
    assert props(result) == ["P1", "P1"]
    assert "granted twice" in result.violations[0].message
    assert any("token 4 granted after token 5" in v.message for v in result.violations)


def test_p1_overlapping_acquires_may_be_in_either_order():
    b = Builder().acquire(1, 0, 30, 2).acquire(2, 10, 20, 1)
    assert check(b.records).ok


def test_p1_issue_log_sees_lost_grants():
    result = check([], issued=[("a", 1), ("a", 2), ("b", 1), ("a", 2)])
    assert props(result) == ["P1"]
    assert "issued token 2 after 2" in result.violations[0].message


def test_p2_stale_write_accepted_in_real_time_and_in_the_audit():
    b = Builder().write(1, 0, 10, 2, "x").write(2, 20, 30, 1, "y")
    audit = [("a", 2, "x", 1), ("a", 1, "y", 2)]
    result = check(b.records, audit=audit)
    assert "P2" in props(result)
    named = [v for v in result.violations if v.property == "P2"]
    assert len(named) == 2
    assert all(any("=y token 1 -> ok" in op for op in v.ops) for v in named)


def test_p8_false_rejection_of_current_holder():
    b = Builder().write(1, 0, 10, 3, "x").write(1, 20, 30, 3, "y", outcome="fail", error="stale-token",
                                                  high_water=3)
    assert props(check(b.records)) == ["P8"]


def test_p3_unissued_and_wrong_scope_tokens():
    b = Builder().acquire(1, 0, 10, 1).write(1, 11, 20, 7, "x")
    b.op(2, "write", 30, 40, "ok", scope="a", key="k", token=tok(1, "b"), value="w", idempotency_key="w")
    result = check(b.records, audit=[("a", 7, "x", 1)])
    messages = [v.message for v in result.violations if v.property == "P3"]
    assert any("never issued" in m for m in messages)
    assert any("token for 'b'" in m for m in messages)


def test_p4_lost_acknowledged_write():
    b = Builder().write(1, 0, 10, 1, "x").write(1, 20, 30, 1, "y").read("final", 100, 101, "x")
    result = check(b.records, audit=[("a", 1, "x", 1)])
    messages = [v.message for v in result.violations if v.property == "P4"]
    assert any("not in the resource's audit trail" in m for m in messages)
    assert any("acknowledged write lost" in m for m in messages)


def test_p4_concurrent_writes_may_end_either_way_and_restores_list_their_losses():
    b = Builder().write(1, 0, 30, 1, "x").write(2, 10, 20, 1, "y").read("final", 100, 101, "x")
    assert check(b.records).ok
    b = Builder().write(1, 0, 10, 1, "x").write(1, 20, 30, 1, "y")
    b.h.nemesis(40, "restore", value={"floor": {"a": 1}, "high_water": {"a": 1}, "rolled_back": ["y"],
                                       "rolled_back_commit_seqs": [2]})
    b.read("final", 100, 101, "x")
    assert check(b.records).ok


def test_p5_restore_below_floor_and_restart_rollback():
    h = History()
    h.nemesis(10, "restore", value={"floor": {"a": 9}, "high_water": {"a": 4}})
    h.nemesis(20, "restart-resource", value={"high_water": {"a": 2}, "commit_seq": 1})
    result = check(h.records, audit=[("a", 3, "x", 1)])
    assert props(result) == ["P5", "P5"]


def test_p6_idempotency_key_applied_twice():
    b = Builder().write(1, 0, 10, 1, "x")
    result = check(b.records, audit=[("a", 1, "x", 1), ("a", 1, "x", 2)])
    assert props(result) == ["P6"]


def test_p7_interleaved_tokens():
    b = Builder().write(1, 0, 100, 1, "a1").write(2, 0, 100, 2, "b1", key="j").write(3, 0, 100, 1, "a2")
    audit = [("a", 1, "a1", 1), ("a", 2, "b1", 2), ("a", 1, "a2", 3)]
    result = check(b.records, audit=audit)
    assert "P7" in props(result)
    p7 = next(v for v in result.violations if v.property == "P7")
    assert len(p7.ops) == 3


def test_history_round_trips_through_json_lines():
    b = Builder().acquire(1, 0, 10, 1).write(1, 11, 20, 1, "v1")
    out = io.StringIO()
    dump_jsonl(b.records, out)
    back = load_jsonl(io.StringIO(out.getvalue()))
    assert back == b.records
    assert [op.type for op in pair(back)] == ["ok", "ok"]


def test_an_unfinished_operation_is_info():
    h = History()
    h.invoke(0, 1, "write", scope="a", key="k", token=1, value="x")
    (op,) = pair(h.records)
    assert op.type == "info"


# --- P9 lock-delay (C5), on the coordinator's lease log -----------------------------------------

_MS = 1_000_000


class LeaseLog:
    """The coordinator's lease log by hand: times in ms on the named coordinator clock."""

    def __init__(self, delay_ms: int = 500) -> None:
        self.records: list[dict] = []
        self.delay_ms = delay_ms

    def _add(self, f, at_ms, clock=0, scope="a", t_ms=None, **value):
        record = {"t_ns": (t_ms if t_ms is not None else at_ms) * _MS, "process": "coordinator", "type": "info",
                  "f": f, "value": dict(value, clock=clock, at_ns=at_ms * _MS)}
        if scope is not None:
            record["scope"] = scope
        self.records.append(record)
        return self

    def grant(self, lease, token, at_ms, ttl_ms=1000, **kw):
        return self._add("grant", at_ms, lease=lease, token=token, expires_ns=(at_ms + ttl_ms) * _MS,
                         lock_delay_ms=self.delay_ms, **kw)

    def renew(self, lease, at_ms, ttl_ms=1000, **kw):
        return self._add("renew", at_ms, lease=lease, expires_ns=(at_ms + ttl_ms) * _MS, **kw)

    def release(self, lease, at_ms, **kw):
        return self._add("release", at_ms, lease=lease, **kw)

    def crash(self, at_ms, clock=0, **kw):
        return self._add("crash", at_ms, clock=clock, scope=None, **kw)

    def restart(self, at_ms, clock=0, **kw):
        return self._add("restart", at_ms, clock=clock, scope=None, **kw)


def test_p9_control_a_grant_before_the_lock_delay_passed_is_flagged():
    # Lease 1 expires unreleased at 1000; the delay runs to 1500; lease 2 is granted at 1200.
    log = LeaseLog().grant("L1", 1, 0).grant("L2", 2, 1200)
    result = check(log.records)
    assert props(result) == ["P9"], result
    assert "before its lock-delay of 500 ms passed" in result.violations[0].message
    # A grant while the previous lease was unexpired is flagged too (C2 on the coordinator's clock).
    assert props(check(LeaseLog(delay_ms=0).grant("L1", 1, 0).grant("L2", 2, 999).records)) == ["P9"]


def test_p9_holds_after_the_delay_after_a_release_and_after_a_renew():
    assert check(LeaseLog().grant("L1", 1, 0).grant("L2", 2, 1500).records).ok  # exactly at the end
    assert check(LeaseLog().grant("L1", 1, 0).release("L1", 300).grant("L2", 2, 301).records).ok
    renewed = LeaseLog().grant("L1", 1, 0).renew("L1", 900).grant("L2", 2, 1600)
    assert props(check(renewed.records)) == ["P9"]  # the renew moved the expiry to 1900: the delay to 2400
    assert check(LeaseLog().grant("L1", 1, 0).renew("L1", 900).grant("L2", 2, 2400).records).ok
    # A release of another lease id does not end this one; scopes are independent.
    other = LeaseLog().grant("L1", 1, 0).release("X", 100).grant("L2", 2, 200)
    assert props(check(other.records)) == ["P9"]
    assert check(LeaseLog().grant("L1", 1, 0).grant("M1", 1, 10, scope="b").records).ok


def test_p9_is_judged_on_the_coordinator_clock_not_on_true_time():
    # The coordinator's clock jumps forward 1588 ms (a nemesis clock jump): by its clock lease 1
    # expired and the delay passed, though only 156 ms of true time went by. Not a violation
    # (C3: the coordinator's clock judges expiry) -- a checker on t_ns would flag it.
    log = LeaseLog().grant("L1", 1, 0, t_ms=286).grant("L2", 2, 1744, t_ms=442)
    assert check(log.records).ok


def test_p9_across_restarts_and_failovers():
    # Same clock: the downtime counts, as the clock counted it.
    same = LeaseLog().grant("L1", 1, 0).crash(1100).restart(1400).grant("L2", 2, 1500)
    assert check(same.records).ok
    early = LeaseLog().grant("L1", 1, 0).crash(1100).restart(1200).grant("L2", 2, 1300)
    assert props(check(early.records)) == ["P9"]
    # Failover: the new clock starts where the old one was at the crash; its downtime does not count.
    # Lease 1 expired at 1000 (old clock), crash at 1100: 400 ms of delay are left at the restart.
    failover = LeaseLog().grant("L1", 1, 0).crash(1100).restart(50_000, clock=1)
    assert props(check(failover.grant("L2", 2, 50_100, clock=1).records)) == ["P9"]
    failover = LeaseLog().grant("L1", 1, 0).crash(1100).restart(50_000, clock=1)
    assert check(failover.grant("L2", 2, 50_500, clock=1).records).ok
    # Readings of the old clock are never compared with the new one raw: lease 1 (held at the crash)
    # is held a full TTL from the restart at 5, then delayed to 1505, all on the new clock.
    assert check(LeaseLog().grant("L1", 1, 9_000).crash(9_100).restart(5, clock=1)
                 .grant("L2", 2, 1_505, clock=1).records).ok


def test_p9_passes_over_histories_without_a_lease_log():
    b = Builder()
    b.acquire(1, 0, 10, 1).acquire(2, 20, 30, 2)
    assert check(b.records).ok


# --- P10 the semaphore, on the coordinator's lease log -------------------------------------------


def test_p10_control_more_holders_than_slots_is_flagged():
    # Two slots, a and b, held from 0 and 10; a lease of c (a third slot the semaphore does not admit) at 20.
    log = LeaseLog(delay_ms=0).grant("A1", 1, 0).grant("B1", 1, 10, scope="b").grant("C1", 1, 20, scope="c")
    result = check(log.records, semaphore_slots=2)
    assert props(result) == ["P10"], result
    assert "3 holders of a semaphore of 2 slots at once" in result.violations[0].message
    assert check(log.records, semaphore_slots=3).ok
    assert check(log.records).ok  # no semaphore declared: P10 is not judged


def test_p10_holds_when_a_holder_released_or_lapsed_and_judges_each_slots_tokens():
    released = LeaseLog(delay_ms=0).grant("A1", 1, 0).grant("B1", 1, 10, scope="b").release("A1", 15)
    assert check(released.grant("C1", 1, 20, scope="c").records, semaphore_slots=2).ok
    lapsed = LeaseLog(delay_ms=0).grant("A1", 1, 0, ttl_ms=100).grant("B1", 1, 10, scope="b")
    assert check(lapsed.grant("C1", 1, 100, scope="c").records, semaphore_slots=2).ok  # A1's deadline was 100
    renewed = LeaseLog(delay_ms=0).grant("A1", 1, 0, ttl_ms=100).renew("A1", 90, ttl_ms=100)
    renewed.grant("B1", 1, 10, scope="b").grant("C1", 1, 150, scope="c")
    assert props(check(renewed.records, semaphore_slots=2)) == ["P10"]  # the renew held A1 to 190
    # Each slot's tokens rise from one grant to the next (scopes independent).
    again = LeaseLog(delay_ms=0).grant("A1", 5, 0, ttl_ms=100).grant("A2", 5, 200).grant("B1", 1, 300, scope="b")
    result = check(again.records, semaphore_slots=2)
    assert [v.message for v in result.violations if v.property == "P10"] == [
        "slot 'a': token 5 granted after token 5"], result
