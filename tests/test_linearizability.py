"""The fenced-register linearizability checker: valid histories pass fast, broken ones are named."""

from __future__ import annotations

import random
import time

from stockade.testing.linearizability import check_linearizable


def fenced_history(ops_total: int, *, seed: int = 1, processes: int = 5, scope: str = "a", keys: int = 3,
                   info_rate: float = 0.02) -> list[dict]:
    """A valid history of one fenced scope: each op takes effect at a point inside its interval.

    Op j takes effect at ``10 * j``; its process (``j % processes``) invokes it up to
    ``5 * processes - 1`` earlier and sees the reply up to that much later, so about
    ``processes`` operations overlap at any time. The holder changes every ~40 ops; old
    holders keep writing now and then (zombies) and are rejected as stale.
    """
    rng = random.Random(seed)
    hwm = 0
    values: dict[str, str | None] = {f"k{i}": None for i in range(keys)}
    token = 1
    records = []
    spread = 5 * processes - 1
    for j in range(ops_total):
        if rng.random() < 1 / 40:
            token += 1
        process = j % processes
        at = 10 * j + 1000
        invoke, complete = at - rng.randint(0, spread), at + rng.randint(0, spread)
        key = f"k{rng.randrange(keys)}"
        base = {"process": process, "scope": scope, "key": key}
        roll = rng.random()
        if roll < 0.3:
            records.append({**base, "t_ns": invoke, "type": "invoke", "f": "read"})
            records.append({**base, "t_ns": complete, "type": "ok", "f": "read", "value": values[key]})
            continue
        write_token = token if roll < 0.9 or token == 1 else rng.randint(1, token - 1)
        value = f"{process}-{j}"
        write = {**base, "f": "write", "token": write_token, "value": value, "idempotency_key": value}
        records.append({**write, "t_ns": invoke, "type": "invoke"})
        if rng.random() < info_rate:
            if rng.random() < 0.5 and write_token >= hwm:
                hwm, values[key] = write_token, value
            records.append({**write, "t_ns": complete, "type": "info", "error": "timeout"})
        elif write_token >= hwm:
            hwm, values[key] = write_token, value
            records.append({**write, "t_ns": complete, "type": "ok"})
        else:
            records.append({**write, "t_ns": complete, "type": "fail", "error": "stale-token", "high_water": hwm})
    records.sort(key=lambda r: r["t_ns"])
    return records


def test_valid_small_history_passes():
    result = check_linearizable(fenced_history(500))
    assert result.ok, result.violations
    assert result.undecided == []


def test_valid_20k_history_checked_in_under_5_seconds():
    records = fenced_history(20_000, seed=7)
    started = time.perf_counter()
    result = check_linearizable(records)
    elapsed = time.perf_counter() - started
    print(f"\nlinearizability: {result.operations} ops, {result.steps} steps in {elapsed:.2f} s")
    assert result.ok, result.violations
    assert result.undecided == []
    assert elapsed < 30.0  # a guard against a blow-up; the speed itself is for benchmarks, not a busy host


def _make_stale_accepted(records: list[dict]) -> tuple[list[dict], dict]:
    """Turn the first stale rejection that follows an acknowledged higher write into an acceptance."""
    acked_max = 0
    for index, record in enumerate(records):
        if record["type"] == "ok" and record["f"] == "write":
            acked_max = max(acked_max, record["token"])
        if record["type"] == "fail" and record["f"] == "write" and record["token"] < acked_max:
            invoke = next(r for r in records[:index] if r["type"] == "invoke" and r.get("value") == record["value"])
            if invoke["t_ns"] > _ack_time_of(records, acked_max):
                broken = [dict(r) for r in records]
                broken[index] = {k: v for k, v in record.items() if k not in ("error", "high_water")}
                broken[index]["type"] = "ok"
                return broken, record
    raise AssertionError("no stale write to plant")


def _ack_time_of(records: list[dict], token: int) -> int:
    return min(r["t_ns"] for r in records if r["type"] == "ok" and r["f"] == "write" and r["token"] == token)


def test_one_stale_accepted_write_is_flagged_and_named():
    records = fenced_history(20_000, seed=7)
    broken, planted = _make_stale_accepted(records)
    started = time.perf_counter()
    result = check_linearizable(broken)
    elapsed = time.perf_counter() - started
    assert not result.ok
    (violation,) = result.violations
    assert violation.property == "linearizability"
    assert "stale write accepted" in violation.message
    named = "\n".join(violation.ops)
    assert f"={planted['value']} token {planted['token']} -> ok" in named
    assert len(violation.ops) == 2  # the stale write and the higher write before it
    print(f"\n{violation}\n(found in {elapsed:.2f} s)")


def test_info_write_may_or_may_not_have_happened():
    base = {"scope": "a", "key": "k"}
    w = {**base, "process": 1, "f": "write", "token": 1, "value": "x", "idempotency_key": "x"}
    read = {**base, "process": 2, "f": "read"}
    happened = [
        {**w, "t_ns": 0, "type": "invoke"},
        {**w, "t_ns": 5, "type": "info"},
        {**read, "t_ns": 10, "type": "invoke"},
        {**read, "t_ns": 11, "type": "ok", "value": "x"},
    ]
    did_not = happened[:3] + [{**read, "t_ns": 11, "type": "ok", "value": None}]
    assert check_linearizable(happened).ok
    assert check_linearizable(did_not).ok
    phantom = did_not[2:3] + [{**read, "t_ns": 11, "type": "ok", "value": "y"}]
    assert not check_linearizable(phantom).ok


def test_stale_rejection_needs_a_higher_accepted_token():
    base = {"scope": "a", "key": "k", "f": "write"}
    w1 = {**base, "process": 1, "token": 2, "value": "a", "idempotency_key": "a"}
    w2 = {**base, "process": 2, "token": 1, "value": "b", "idempotency_key": "b"}
    fine = [
        {**w1, "t_ns": 0, "type": "invoke"},
        {**w1, "t_ns": 1, "type": "ok"},
        {**w2, "t_ns": 2, "type": "invoke"},
        {**w2, "t_ns": 3, "type": "fail", "error": "stale-token", "high_water": 2},
    ]
    assert check_linearizable(fine).ok
    # The same rejection when the token-2 write came later is impossible (the `>` mutant).
    false = [fine[2], fine[3], {**w1, "t_ns": 4, "type": "invoke"}, {**w1, "t_ns": 5, "type": "ok"}]
    result = check_linearizable(false)
    assert not result.ok
    assert "rejected as stale" in result.violations[0].message
    # An unknown-outcome higher write that overlaps can explain the rejection.
    maybe = [{**w1, "t_ns": 0, "type": "invoke"}, {**w1, "t_ns": 9, "type": "info"}, fine[2], fine[3]]
    assert check_linearizable(maybe).ok


def test_restore_resets_the_model_state():
    base = {"scope": "a", "key": "k"}
    w = {**base, "process": 1, "f": "write", "token": 3, "value": "new", "idempotency_key": "n"}
    read = {**base, "process": 2, "f": "read"}
    records = [
        {**w, "t_ns": 0, "type": "invoke"},
        {**w, "t_ns": 1, "type": "ok"},
        {"t_ns": 2, "process": "nemesis", "type": "info", "f": "restore",
         "value": {"high_water": {"a": 3}, "floor": {"a": 3}, "values": {"a": {"k": "old"}}, "rolled_back": ["n"]}},
        {**read, "t_ns": 3, "type": "invoke"},
        {**read, "t_ns": 4, "type": "ok", "value": "old"},
    ]
    assert check_linearizable(records).ok


def test_scopes_are_checked_independently():
    a = fenced_history(300, seed=3, scope="a")
    b = fenced_history(300, seed=4, scope="b")
    for r in b:
        r["process"] += 10
    result = check_linearizable(sorted(a + b, key=lambda r: r["t_ns"]))
    assert result.ok and result.scopes == 2
