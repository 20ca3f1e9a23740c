"""The P1–P7 checkers: each passes a good history and flags the matching broken one."""

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
