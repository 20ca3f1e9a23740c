"""The lease table against a naive model, by hypothesis, plus the named edge cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.core import leases as L
from stockade.core.errors import InvalidArgument, InvariantViolation, LimitExceeded, NotHolder
from stockade.core.limits import TOKEN_VALUE_MAX

CLUSTER = "0123456789abcdef"
MS = 1_000_000


def req(scope="s", lid="a", ttl_ms=100, deadline_ns=0, holder="h"):
    return L.AcquireRequest(
        cluster=CLUSTER, scope=scope, lease_id=lid.ljust(16, "x"), holder=holder, ttl_ms=ttl_ms,
        wait_deadline_ns=deadline_ns,
    )


class NaiveModel:
    """The rules written the plain way, per scope: used only as the oracle."""

    def __init__(self, lock_delay_ms=0, stale_ms=2000):
        self.last = {}
        self.held = {}  # scope -> [lid, expires]
        self.delay = {}
        self.queue = {}  # scope -> list of [lid, deadline, stale]
        self.lock_delay = lock_delay_ms * MS
        self.stale = stale_ms * MS

    def _tick(self, scope, now):
        h = self.held.get(scope)
        if h and now >= h[1]:
            del self.held[scope]
            self.delay[scope] = max(self.delay.get(scope, 0), h[1] + self.lock_delay)
        self.queue[scope] = [w for w in self.queue.get(scope, []) if now < w[1] and now < w[2]]

    def acquire(self, scope, lid, ttl_ms, deadline, now):
        self._tick(scope, now)
        h = self.held.get(scope)
        if h and h[0] == lid:
            return ("granted", self.last[scope])
        q = self.queue[scope]
        ids = [w[0] for w in q]
        if not h and now >= self.delay.get(scope, 0) and (not q or ids[0] == lid):
            self.last[scope] = self.last.get(scope, 0) + 1
            self.held[scope] = [lid, now + ttl_ms * MS]
            self.queue[scope] = [w for w in q if w[0] != lid]
            return ("granted", self.last[scope])
        if now >= deadline:
            self.queue[scope] = [w for w in q if w[0] != lid]
            return ("timedout",)
        if lid in ids:
            w = q[ids.index(lid)]
            if w[2] - now < self.stale // 2:
                w[2] = now + self.stale
            return ("queued", ids.index(lid))
        q.append([lid, deadline, now + self.stale])
        return ("queued", len(q) - 1)

    def renew(self, scope, lid, ttl_ms, now):
        self._tick(scope, now)
        h = self.held.get(scope)
        if not h or h[0] != lid:
            return ("notholder",)
        h[1] = now + ttl_ms * MS
        return ("renewed",)

    def release(self, scope, lid, now):
        self._tick(scope, now)
        h = self.held.get(scope)
        if not h or h[0] != lid:
            return ("released", False)
        del self.held[scope]
        return ("released", True)


ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "renew", "release"]),
        st.sampled_from(["s", "t"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 300),  # time step in ms
        st.integers(100, 400),  # ttl_ms
        st.integers(0, 500),  # wait in ms
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from([0, 150]))
def test_lease_table_matches_naive_model(operations, lock_delay_ms):
    policy = L.LeasePolicy(lock_delay_ms=lock_delay_ms)
    table = {}
    model = NaiveModel(lock_delay_ms)
    ttl_of = {}
    now = 0
    issued = {}
    for op, scope, lid, step_ms, ttl_ms, wait_ms in operations:
        now += step_ms * MS
        record = table.get(scope) or L.ScopeRecord(scope)
        lease_id = lid.ljust(16, "x")
        if op == "acquire":
            last_before = record.last_token
            record, outcome = L.acquire(record, req(scope, lid, ttl_ms, now + wait_ms * MS), now, policy)
            expected = model.acquire(scope, lid, ttl_ms, now + wait_ms * MS, now)
            if isinstance(outcome, L.Granted):
                got = ("granted", outcome.lease.token.value)
                if record.last_token != last_before:  # a new grant, not a repeated request
                    ttl_of[(scope, lid)] = ttl_ms
                    assert outcome.lease.token.value > issued.get(scope, 0), "C1: token must increase"
                    issued[scope] = outcome.lease.token.value
            elif isinstance(outcome, L.Queued):
                got = ("queued", outcome.position)
            else:
                got = ("timedout",)
        elif op == "renew":
            expected = model.renew(scope, lid, ttl_of.get((scope, lid), 0), now)
            try:
                record, _lease = L.renew(record, lease_id, now, policy)
                got = ("renewed",)
            except NotHolder:
                got = ("notholder",)
        else:
            record, outcome = L.release(record, lease_id, now, policy)
            got = ("released", outcome.released)
            expected = model.release(scope, lid, now)
        table[scope] = record
        assert got == expected, (op, scope, lid, now)
        # C2: at most one unexpired lease, and it carries the latest token
        if record.lease is not None and now < record.lease.expires_ns:
            assert record.lease.token.value == record.last_token


def test_transition_table_is_the_spec():
    S, E = L.ScopeState, L.Event
    assert L.TRANSITIONS[(S.FREE, E.GRANT)] is S.HELD
    assert (S.FREE, E.RELEASE) not in L.TRANSITIONS
    with pytest.raises(InvariantViolation):
        L._transition(S.FREE, E.RENEW)


def test_repeated_acquire_returns_same_token_not_a_new_one():
    policy = L.LeasePolicy()
    r0 = L.ScopeRecord("s")
    r1, g1 = L.acquire(r0, req(), 0, policy)
    r2, g2 = L.acquire(r1, req(), 10, policy)
    assert g1 == g2 and r2.last_token == 1


def test_fifo_order_and_no_barging():
    policy = L.LeasePolicy()
    r, _ = L.acquire(L.ScopeRecord("s"), req(lid="a"), 0, policy)
    r, q1 = L.acquire(r, req(lid="b", deadline_ns=10**10), 1, policy)
    r, q2 = L.acquire(r, req(lid="c", deadline_ns=10**10), 2, policy)
    assert (q1.position, q2.position) == (0, 1)
    r, _ = L.release(r, "a".ljust(16, "x"), 3, policy)
    r, out_c = L.acquire(r, req(lid="c", deadline_ns=10**10), 4, policy)
    assert isinstance(out_c, L.Queued)  # c may not barge ahead of b
    r, out_b = L.acquire(r, req(lid="b", deadline_ns=10**10), 5, policy)
    assert isinstance(out_b, L.Granted) and out_b.lease.token.value == 2


def test_lock_delay_after_expiry_not_after_release():
    policy = L.LeasePolicy(lock_delay_ms=500)
    r, _ = L.acquire(L.ScopeRecord("s"), req(lid="a", ttl_ms=100), 0, policy)
    r, out = L.acquire(r, req(lid="b"), 200 * MS, policy)  # a expired at 100 ms; delay until 600 ms
    assert isinstance(out, L.TimedOut)
    r, out = L.acquire(r, req(lid="b"), 600 * MS, policy)
    assert isinstance(out, L.Granted)
    r, _ = L.release(r, out.lease.lease_id, 601 * MS, policy)
    r, out = L.acquire(r, req(lid="c"), 602 * MS, policy)
    assert isinstance(out, L.Granted)


def test_the_one_lock_delay_decision():
    # C5 as the engine, the etcd port and the ZooKeeper port ask it, each on its own clock.
    assert L.lock_delay_end_ns(lapsed=True, ended_ns=100 * MS, lock_delay_ms=500) == 600 * MS
    assert L.lock_delay_end_ns(lapsed=False, ended_ns=100 * MS, lock_delay_ms=500) == 100 * MS  # released: at once
    assert L.lock_delay_end_ns(lapsed=True, ended_ns=100 * MS, lock_delay_ms=0) == 100 * MS  # no delay
    # The engine's record keeps what it returns: an expiry at 100 ms with a 500 ms delay, pending till 600 ms.
    policy = L.LeasePolicy(lock_delay_ms=500)
    r, _ = L.acquire(L.ScopeRecord("s"), req(lid="a", ttl_ms=100), 0, policy)
    assert L.settle(r, 100 * MS, policy).delay_until_ns == 600 * MS
    recovered = L.recover(L.settle(r, 100 * MS, policy), 10**12, policy, same_clock=False)
    assert recovered.delay_until_ns == 10**12 + 500 * MS  # another clock: the delay starts again in full


def test_waiters_bounded_and_dead_waiters_dropped():
    policy = L.LeasePolicy(waiters_per_scope_max=2, waiter_stale_ms=100)
    r, _ = L.acquire(L.ScopeRecord("s"), req(lid="a", ttl_ms=10_000), 0, policy)
    r, _ = L.acquire(r, req(lid="b", deadline_ns=10**12), 0, policy)
    r, _ = L.acquire(r, req(lid="c", deadline_ns=10**12), 0, policy)
    before = r
    with pytest.raises(LimitExceeded):
        L.acquire(r, req(lid="d", deadline_ns=10**12), 0, policy)
    assert r == before
    # b and c stop polling: after the stale window they no longer block d
    r, out = L.acquire(r, req(lid="d", deadline_ns=10**12), 200 * MS, policy)
    assert isinstance(out, L.Queued) and out.position == 0


def test_token_space_exhaustion_is_an_error_not_a_wrap():
    policy = L.LeasePolicy()
    r = L.ScopeRecord("s", last_token=TOKEN_VALUE_MAX)
    with pytest.raises(LimitExceeded):
        L.acquire(r, req(), 0, policy)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scope": "bad scope"}, {"scope": ""}, {"scope": "x" * 201}, {"ttl_ms": 99}, {"ttl_ms": 3_600_001},
        {"ttl_ms": True}, {"ttl_ms": 1.5}, {"holder": ""}, {"holder": "has space"}, {"lid": "short"},
    ],
)
def test_bad_requests_cannot_exist(kwargs):
    args = {"scope": "s", "lid": "a", "ttl_ms": 100, "holder": "h"}
    args.update(kwargs)
    lid = args.pop("lid")
    with pytest.raises(InvalidArgument):
        L.AcquireRequest(cluster=CLUSTER, lease_id=lid if len(lid) < 16 and lid == "short" else lid.ljust(16, "x"),
                         wait_deadline_ns=0, **args)


def test_the_records_built_field_by_field_name_every_field():
    """`grant` and `release` build a `ScopeRecord` positionally (not with `dataclasses.replace`, for speed): a field
    added to it must be added there too, and this fails until it is."""
    import dataclasses

    from stockade.core.leases import ScopeRecord

    built = ("scope", "last_token", "lease", "delay_until_ns", "waiters")
    assert tuple(f.name for f in dataclasses.fields(ScopeRecord)) == built


def test_the_prevalidated_builds_are_the_checked_ones():
    """`AcquireRequest.prevalidated` and `FencingToken.prevalidated` set their fields by name, unchecked: each must
    build what its checking constructor builds, every field set (a field added to either fails here until it is)."""
    import dataclasses

    from stockade.core.tokens import FencingToken

    args = (CLUSTER, "s", "a" * 16, "h", 100, 5, 7)
    checked, trusted = L.AcquireRequest(*args), L.AcquireRequest.prevalidated(*args)
    assert dataclasses.astuple(trusted) == dataclasses.astuple(checked) == args and trusted == checked
    for token_args in ((CLUSTER, "s", 3), (CLUSTER, "s:1", 2**63 - 1, "0123abcd", "A" * 22)):
        token, built = FencingToken(*token_args), FencingToken.prevalidated(*token_args)
        assert dataclasses.astuple(built) == dataclasses.astuple(token) and built == token
        assert hash(built) == hash(token) and built.encode() == token.encode()


def test_the_engine_refuses_a_request_of_another_cluster():
    """The trusted entry takes a request's values as checked, except its cluster: it must be the engine's own."""
    from stockade.coordinators.memory import MemoryCoordinator

    engine = MemoryCoordinator(cluster_id=CLUSTER)
    other = L.AcquireRequest.prevalidated("f" * 16, "s", "a" * 16, "h", 100, 0)
    with pytest.raises(InvalidArgument):
        engine.try_acquire_request(other)
    assert engine.inspect("s").last_token == 0
    granted = engine.try_acquire_request(L.AcquireRequest.prevalidated(CLUSTER, "s", "a" * 16, "h", 100, 0))
    assert isinstance(granted, L.Granted) and granted.lease.token.value == 1
    with pytest.raises(InvalidArgument):
        MemoryCoordinator(cluster_id="not a cluster id")  # checked once, where the engine is made


class _Text(str):
    """A str subclass: the validators' usual case (an exact str) does not take it; their general path does."""


@pytest.mark.parametrize(("validator", "value", "ok"), [
    ("validate_holder", "h", True), ("validate_holder", "x" * 200, True), ("validate_holder", "x" * 201, False),
    ("validate_holder", "", False), ("validate_holder", "a b", False), ("validate_holder", "é", False),
    ("validate_holder", "a\n", False), ("validate_holder", 1, False), ("validate_holder", _Text("h"), True),
    ("validate_scope", "s", True), ("validate_scope", "x" * 200, True), ("validate_scope", "x" * 201, False),
    ("validate_scope", ".", False), ("validate_scope", "..", False), ("validate_scope", "...", True),
    ("validate_scope", "a/b", False), ("validate_scope", "", False), ("validate_scope", _Text("s"), True),
    ("validate_ttl_ms", 100, True), ("validate_ttl_ms", 99, False), ("validate_ttl_ms", 3_600_000, True),
    ("validate_ttl_ms", 3_600_001, False), ("validate_ttl_ms", True, False), ("validate_ttl_ms", 100.0, False),
    ("validate_wait", 0, True), ("validate_wait", None, True), ("validate_wait", 300_000, True),
    ("validate_wait", 300_001, False), ("validate_wait", -1, False), ("validate_wait", False, False),
    ("validate_cluster_id", CLUSTER, True), ("validate_cluster_id", CLUSTER.upper(), False),
    ("validate_cluster_id", CLUSTER + "0", False), ("validate_cluster_id", _Text(CLUSTER), True),
])
def test_the_validators_usual_case_agrees_with_their_rules(validator, value, ok):
    """Each validator takes its usual value (an exact str or int) in one test or match, and anything else through
    its general path: the bounds are the same either way, and a refusal is an `InvalidArgument`."""
    from stockade.core import limits, tokens

    check = getattr(limits, validator, None) or getattr(tokens, validator)
    if ok:
        assert check(value) == value
    else:
        with pytest.raises(InvalidArgument):
            check(value)
