"""The simulated processes: coordinator, resource and clients, as sans-IO models.

Each is driven by the `World` (`stockade.testing.sim`): it receives messages
and timer callbacks, reads its own `SimClock`, and sends through the world.
The coordinator runs the real core lease table; the resource applies the
real fence rule (`stockade.core.fence.decide`) atomically; the client follows
the documented client protocol (K1–K3). Mutants (controls) are switched here,
each at the one place the broken variant differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from stockade.core.errors import LimitExceeded, NotHolder
from stockade.core.fence import Accept, FenceDecision, FenceRule, Recorded, Reject, Replay, check_write, decide
from stockade.core.leases import AcquireRequest, Granted, LeasePolicy, LeaseTable, Queued, ScopeRecord
from stockade.core.tokens import FencingToken
from stockade.core.values import WriteResult
from stockade.testing.clock import SimClock

if TYPE_CHECKING:
    from stockade.testing.sim import World

__all__ = ["Node", "Coordinator", "Resource", "Client", "MUTANTS"]

_MS = 1_000_000

#: The controls: each breaks one rule and must be caught by the checkers.
MUTANTS: dict[str, str] = {
    "fencing-off": "the resource accepts every token (no fence at all)",
    "strict-greater": "the resource accepts only token > HWM (`>` instead of `>=`)",
    "check-then-write": "the resource checks the HWM on arrival and writes later, without re-checking",
    "clock-token": "the coordinator takes the token from its clock (milliseconds) instead of a counter",
    "restore-no-floor": "a restore from backup does not apply the coordinator's fence floor",
    "volatile-tokens": "the coordinator answers grants before its token counter is durable",
}


class Node:
    """A simulated process: a clock, up/down, pause, and timers that die with a crash."""

    def __init__(self, world: World, name: str, clock: SimClock) -> None:
        self.world = world
        self.name = name
        self.clock = clock
        self.up = True
        self.incarnation = 0
        self.paused_until_ns = 0

    def timer(self, local_delay_ns: int, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` after ``local_delay_ns`` on this node's clock, unless it crashes first."""
        world = self.world
        world.schedule(world.time.now_ns + self.clock.true_delay_ns(local_delay_ns), self, self.incarnation, fn, args)

    def send(self, dst: str, payload: tuple[Any, ...]) -> None:
        self.world.network.send(self.world.time.now_ns, self.name, dst, payload)

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        raise NotImplementedError


# --- coordinator -------------------------------------------------------------------------------


class Coordinator(Node):
    """The lease table of `stockade.core.leases`, with a durable copy that survives crashes (C1, C3)."""

    def __init__(self, world: World, clock: SimClock, *, cluster: str, policy: LeasePolicy) -> None:
        super().__init__(world, "coordinator", clock)
        self.cluster = cluster
        self.policy = policy
        self.table = LeaseTable(cluster, policy)
        self.durable: dict[str, ScopeRecord] = {}
        self.wait_deadlines: dict[str, int] = {}
        self.mutant = world.mutant
        if self.mutant == "volatile-tokens":
            self.timer(world.options.checkpoint_ms * _MS, self._checkpoint)

    def _persist(self, scope: str) -> None:
        # C1: the record (and with it the token counter) is durable before the reply leaves.
        if self.mutant != "volatile-tokens":
            self.durable[scope] = self.table.records[scope]

    def _checkpoint(self) -> None:
        self.durable = dict(self.table.records)
        self.timer(self.world.options.checkpoint_ms * _MS, self._checkpoint)

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        kind, req_id = payload[0], payload[1]
        now = self.clock.now_ns()
        table = self.table
        if kind == "acquire":
            _, _, scope, lease_id, holder, ttl_ms, wait_ms = payload
            deadline = self.wait_deadlines.setdefault(lease_id, now + wait_ms * _MS)
            previous = table.record(scope).lease
            try:
                outcome = table.acquire(AcquireRequest(self.cluster, scope, lease_id, holder, ttl_ms, deadline), now)
            except LimitExceeded:
                self.send(src, ("busy", req_id))
                return
            if isinstance(outcome, Granted):
                lease = outcome.lease
                fresh = previous is None or previous.lease_id != lease_id or previous.expires_ns <= now
                if fresh:
                    if self.mutant == "clock-token":
                        lease = self._clock_token(scope, lease, now)
                    self.world.issued.append((scope, lease.token.value))
                self._persist(scope)
                self.send(src, ("granted", req_id, lease.token, lease_id))
            elif isinstance(outcome, Queued):
                self._persist(scope)
                self.send(src, ("queued", req_id))
            else:
                self._persist(scope)
                self.wait_deadlines.pop(lease_id, None)
                self.send(src, ("timeout", req_id))
        elif kind == "renew":
            lease_id = payload[2]
            try:
                lease = table.renew(lease_id, now)
            except NotHolder:
                self.send(src, ("not-holder", req_id))
                return
            self._persist(lease.scope)
            self.send(src, ("renewed", req_id))
        elif kind == "release":
            lease_id = payload[2]
            scope = table._scope_of(lease_id)
            outcome = table.release(lease_id, now)
            if scope is not None:
                self._persist(scope)
            self.send(src, ("released", req_id, outcome.released))

    def _clock_token(self, scope: str, lease: Any, now: int) -> Any:
        value = max(1, now // _MS)
        token = FencingToken(cluster=self.cluster, scope=scope, value=value)
        lease = replace(lease, token=token)
        self.table.records[scope] = replace(self.table.records[scope], lease=lease, last_token=value)
        return lease

    def held_scopes(self) -> int:
        if not self.up:
            return 0
        now = self.clock.now_ns()
        return sum(1 for r in self.table.records.values() if r.lease is not None and r.lease.expires_ns > now)

    def crash(self) -> None:
        self.up = False
        self.incarnation += 1
        self.table = LeaseTable(self.cluster, self.policy)
        self.wait_deadlines = {}

    def restart(self, clock: SimClock) -> None:
        """Come back from the durable records; held leases stay held a full TTL from now (C3)."""
        self.clock = clock
        self.up = True
        now = clock.now_ns()
        records = {}
        for scope, record in self.durable.items():
            lease = record.lease
            if lease is not None:
                lease = replace(lease, granted_ns=now, expires_ns=now + lease.ttl_ms * _MS)
            records[scope] = replace(record, lease=lease, waiters=(), delay_until_ns=0)
        self.table = LeaseTable(self.cluster, self.policy, records)
        if self.mutant == "volatile-tokens":
            self.timer(self.world.options.checkpoint_ms * _MS, self._checkpoint)


# --- resource ----------------------------------------------------------------------------------


class ResourceState:
    """What the fenced store keeps: HWM per scope, values, applied idempotency keys, commit lineage."""

    __slots__ = ("high_water", "values", "applied", "lineage")

    def __init__(self) -> None:
        self.high_water: dict[str, int] = {}
        self.values: dict[tuple[str, str], str] = {}
        self.applied: dict[str, Recorded] = {}  # idempotency key -> what a retry is answered with (R3)
        self.lineage: list[int] = []

    def copy(self) -> ResourceState:
        other = ResourceState()
        other.high_water = dict(self.high_water)
        other.values = dict(self.values)
        other.applied = dict(self.applied)
        other.lineage = list(self.lineage)
        return other


class Resource(Node):
    """stockade's fenced store as a model: check and apply in one step (R1), group commit.

    A write is applied to the live state after a processing delay, joins the
    current commit batch, and is answered only when the batch is durable; every
    answer (also a rejection or a read) waits for the batch it depends on, so
    a crash loses only what was never acknowledged.
    """

    def __init__(self, world: World, clock: SimClock, *, cluster: str) -> None:
        super().__init__(world, "resource", clock)
        self.cluster = cluster
        self.mutant = world.mutant
        self.durable = ResourceState()
        self.live = ResourceState()
        self.batch: list[tuple[str, str, str, int, str, int]] = []
        self.waiting: list[tuple[str, tuple[Any, ...]]] = []
        self.fsync_scheduled = False
        self.backups: list[tuple[int, ResourceState]] = []
        self.rng = world.rng_for("resource")

    def _processing_delay(self) -> int:
        top = self.world.options.processing_max_us * 1000
        return self.rng.randint(0, top) if top else 0

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        kind = payload[0]
        early = None
        if kind == "write" and self.mutant == "check-then-write":
            early = self._decide(payload[6], payload[2])  # the check, separated from the write: the bug
        delay = self._processing_delay()
        if delay:
            self.timer(delay, self._process, src, payload, early)
        else:
            self._process(src, payload, early)

    def _rule(self, token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
        """The comparison, as the mutant (if any) breaks it."""
        if self.mutant == "fencing-off":
            return Accept(token.value)
        decision = decide(token, cluster=cluster, scope=scope, high_water=high_water)
        if self.mutant == "strict-greater" and isinstance(decision, Accept) and token.value == high_water:
            return Reject("stale", high_water)
        return decision

    def _decide(self, token: FencingToken, scope: str) -> FenceDecision:
        high = self.live.high_water.get(scope, 0)
        return self._rule(token, cluster=self.cluster, scope=scope, high_water=high)

    @staticmethod
    def _recorded(scope: str, key: str, idempotency_key: str, token_value: int, high_water: int) -> Recorded:
        # The model's requests carry one idempotency key per operation, so the key is its own fingerprint.
        return Recorded(idempotency_key, WriteResult(scope, key, token_value, high_water, 0, replayed=True))

    def _process(self, src: str, payload: tuple[Any, ...], early: Accept | Reject | None) -> None:
        kind, req_id = payload[0], payload[1]
        live = self.live
        if kind == "read":
            _, _, scope, key = payload
            self._answer(src, ("value", req_id, live.values.get((scope, key))))
            return
        _, _, scope, key, value, idempotency_key, token = payload
        rule: FenceRule = self._rule
        if early is not None:
            def rule(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
                return early  # the check made on arrival, trusted now: the check-then-write bug
        # The store's order, R2 -> R3 -> R1, from the one function every adapter calls.
        decision = check_write(
            token, scope=scope, cluster=self.cluster, high_water=live.high_water.get(scope, 0),
            fingerprint=idempotency_key, recorded=live.applied.get(idempotency_key), rule=rule,
        )
        if isinstance(decision, Replay):
            self._answer(src, ("ok", req_id))  # R3: the original result, nothing applied again
            return
        if isinstance(decision, Reject):
            self._answer(src, ("rejected", req_id, decision.reason, decision.high_water))
            return
        new_high = token.value if self.mutant in ("check-then-write", "fencing-off") else decision.new_high_water
        live.high_water[scope] = new_high
        live.values[(scope, key)] = value
        live.applied[idempotency_key] = self._recorded(scope, key, idempotency_key, token.value, new_high)
        self.batch.append((scope, key, value, new_high, idempotency_key, token.value))
        self._answer(src, ("ok", req_id))

    def _answer(self, dst: str, payload: tuple[Any, ...]) -> None:
        if not self.batch:
            self.send(dst, payload)
            return
        self.waiting.append((dst, payload))
        top = self.world.options.commit_max_us * 1000
        if not top:
            self.fsync()  # no group-commit window: every write is its own durable commit
        elif not self.fsync_scheduled:
            self.fsync_scheduled = True
            self.timer(self.rng.randint(0, top), self.fsync)

    def fsync(self) -> None:
        """Make the batch durable, record it in the audit trail, then answer."""
        self.fsync_scheduled = False
        durable = self.durable
        world = self.world
        for scope, key, value, new_high, idempotency_key, token_value in self.batch:
            durable.high_water[scope] = new_high
            durable.values[(scope, key)] = value
            durable.applied[idempotency_key] = self._recorded(scope, key, idempotency_key, token_value, new_high)
            seq = len(world.audit) + 1
            world.audit.append((scope, token_value, idempotency_key, seq))
            durable.lineage.append(seq)
            self.live.lineage.append(seq)
        self.batch = []
        waiting, self.waiting = self.waiting, []
        for dst, payload in waiting:
            self.send(dst, payload)

    def _lose_volatile(self) -> None:
        self.incarnation += 1
        self.live = self.durable.copy()
        self.batch = []
        self.waiting = []
        self.fsync_scheduled = False

    def crash(self) -> None:
        self.up = False
        self._lose_volatile()

    def restart(self) -> None:
        self.up = True

    def backup(self) -> None:
        self.backups.append((len(self.world.audit), self.durable.copy()))
        del self.backups[:-4]

    def restore(self, index: int, floors: dict[str, int]) -> dict[str, Any]:
        """Restore backup ``index``; apply the fence floors (R4) unless the mutant forgets to."""
        self._lose_volatile()
        seq, backup = self.backups[index]
        del self.backups[index + 1 :]  # later backups belong to the abandoned timeline
        restored = backup.copy()
        removed = self.durable.lineage[len(backup.lineage) :]
        if self.mutant != "restore-no-floor":
            for scope, floor in floors.items():
                if floor > restored.high_water.get(scope, 0):
                    restored.high_water[scope] = floor
        self.durable = restored
        self.live = restored.copy()
        audit = self.world.audit
        values: dict[str, dict[str, str]] = {}
        for (scope, key), value in restored.values.items():
            values.setdefault(scope, {})[key] = value
        return {
            "backup_commit_seq": seq,
            "floor": dict(floors),
            "high_water": {s: restored.high_water.get(s, 0) for s in self.world.scopes},
            "rolled_back": [audit[s - 1][2] for s in removed],
            "rolled_back_commit_seqs": list(removed),
            "values": values,
        }


# --- client -------------------------------------------------------------------------------------


class _Lease:
    __slots__ = ("scope", "token", "lease_id", "deadline_ns", "renew_sent_ns", "writes_left")

    def __init__(self, scope: str, token: FencingToken, lease_id: str, deadline_ns: int, sent_ns: int,
                 writes_left: int) -> None:
        self.scope = scope
        self.token = token
        self.lease_id = lease_id
        self.deadline_ns = deadline_ns
        self.renew_sent_ns = sent_ns
        self.writes_left = writes_left


class _ClientOp:
    __slots__ = ("id", "kind", "scope", "key", "value", "token", "lease_id", "sent", "attempts", "wait_until_ns",
                 "wait_ms", "polling")

    def __init__(self, op_id: int, kind: str) -> None:
        self.id = op_id
        self.kind = kind
        self.scope = ""
        self.key = ""
        self.value = ""
        self.token: FencingToken | None = None
        self.lease_id = ""
        self.sent: dict[int, int] = {}
        self.attempts = 0
        self.wait_until_ns = 0
        self.wait_ms = 0
        self.polling = False


class Client(Node):
    """The documented client protocol: one operation at a time, token in every write.

    - K1: writes carry the lease's token, never anything else.
    - K2: a lease is good until the send time of its last successful acquire or
      renew plus TTL minus a drift margin, on this client's clock; past that it
      is lost, and no write is sent.
    - K3: a rejected write is never retried; the client drops the lease and
      acquires again. A write that timed out is retried with the same
      idempotency key (R3 makes that safe).
    """

    def __init__(self, world: World, index: int, clock: SimClock, *, autopilot: bool) -> None:
        super().__init__(world, f"c{index}", clock)
        self.index = index
        self.autopilot = autopilot
        self.lease: _Lease | None = None
        self.op: _ClientOp | None = None
        self.old_tokens: list[FencingToken] = []
        self.requests: dict[int, int] = {}
        self.rng = world.rng_for(self.name)
        self.counter = 0
        o = world.options
        self.ttl_ms = o.ttl_ms
        self.margin_ns = o.ttl_ms * _MS * o.drift_margin_percent // 100
        self.request_timeout_ns = max(1, o.ttl_ms // 2) * _MS
        if autopilot:
            self.timer(self.rng.randint(0, o.ttl_ms) * _MS, self.next_action)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _new_op(self, kind: str) -> _ClientOp:
        self.counter += 1
        self.op = _ClientOp(self.counter, kind)
        return self.op

    def _request(self, dst: str, payload_tail: tuple[Any, ...], kind: str) -> int:
        op = self.op
        assert op is not None
        req_id = self.world.next_request_id()
        self.requests[req_id] = op.id
        op.sent[req_id] = self.clock.now_ns()
        op.attempts += 1
        self.send(dst, (kind, req_id) + payload_tail)
        self.timer(self.request_timeout_ns, self._on_timeout, op.id, req_id)
        return req_id

    def _finish(self, type_: str, **fields: Any) -> None:
        self.op = None
        self.world.history.complete(self.world.time.now_ns, self.index, type_, **fields)
        if self.autopilot:
            self.timer(self.rng.randint(0, self.world.options.think_max_ms * _MS), self.next_action)

    def _drop_lease(self, why: str) -> None:
        if self.lease is not None:
            self.old_tokens.append(self.lease.token)
            self.world.narrate(self.name, f"gives up its lease (token {self.lease.token.value}): {why}")
            self.lease = None

    def lease_valid(self) -> bool:
        """K2: the local conservative deadline has not passed."""
        lease = self.lease
        if lease is None:
            return False
        if self.clock.now_ns() >= lease.deadline_ns:
            self._drop_lease("local deadline passed")
            return False
        return True

    # -- operations ----------------------------------------------------------------------------

    def begin_acquire(self, scope: str, wait_ms: int = 0) -> None:
        op = self._new_op("acquire")
        op.scope = scope
        op.lease_id = f"lease-{self.index}-{op.id:08d}"
        op.wait_ms = wait_ms
        op.wait_until_ns = self.clock.now_ns() + wait_ms * _MS + 2 * self.request_timeout_ns
        self.world.history.invoke(self.world.time.now_ns, self.index, "acquire", scope=scope)
        self._send_acquire()

    def _send_acquire(self) -> None:
        op = self.op
        if op is None or op.kind != "acquire":
            return
        self._request("coordinator", (op.scope, op.lease_id, f"p{self.index}", self.ttl_ms, op.wait_ms), "acquire")

    def begin_write(self, key: str, *, stale: bool = False, scope: str | None = None) -> bool:
        """Write under the held lease (K1); ``stale``: a zombie's old token; ``scope``: misuse.

        Returns False (and does nothing) when the lease is not valid (K2).
        """
        if stale:
            candidates = [t for t in self.old_tokens if scope is None or t.scope == scope]
            if not candidates:
                return False
            token = candidates[-1]
            target = token.scope
        else:
            if not self.lease_valid():
                return False
            token = self.lease.token  # type: ignore[union-attr]
            target = scope or token.scope
            self.lease.writes_left -= 1  # type: ignore[union-attr]
        op = self._new_op("write")
        op.scope, op.key, op.token = target, key, token
        op.value = f"{self.index}-{op.id}"
        self.world.history.invoke(self.world.time.now_ns, self.index, "write", scope=target, key=key,
                                  token=token.encode(), value=op.value, idempotency_key=op.value)
        o = self.world.options
        if self.autopilot and o.zombie_pause_probability and self.rng.random() < o.zombie_pause_probability:
            # Paused between the lease check and the send: the zombie leader (S01).
            self.world.pause(self, self.rng.randint(1, 5) * o.ttl_ms * _MS, reason="between lease check and write")
            self.timer(0, self._send_write, op.id)
        else:
            self._send_write(op.id)
        return True

    def _send_write(self, op_id: int) -> None:
        op = self.op
        if op is None or op.id != op_id:
            return
        self._request("resource", (op.scope, op.key, op.value, op.value, op.token), "write")

    def begin_read(self, scope: str, key: str) -> None:
        op = self._new_op("read")
        op.scope, op.key = scope, key
        self.world.history.invoke(self.world.time.now_ns, self.index, "read", scope=scope, key=key)
        self._request("resource", (scope, key), "read")

    def begin_renew(self) -> bool:
        if not self.lease_valid():
            return False
        lease = self.lease
        op = self._new_op("renew")
        op.scope, op.token, op.lease_id = lease.scope, lease.token, lease.lease_id  # type: ignore[union-attr]
        self.world.history.invoke(self.world.time.now_ns, self.index, "renew", scope=op.scope,
                                  token=op.token.encode())  # type: ignore[union-attr]
        lease.renew_sent_ns = self.clock.now_ns()  # type: ignore[union-attr]
        self._request("coordinator", (op.lease_id,), "renew")
        return True

    def begin_release(self) -> bool:
        lease = self.lease
        if lease is None:
            return False
        op = self._new_op("release")
        op.scope, op.token, op.lease_id = lease.scope, lease.token, lease.lease_id
        self.world.history.invoke(self.world.time.now_ns, self.index, "release", scope=op.scope,
                                  token=op.token.encode())
        self.old_tokens.append(lease.token)
        self.lease = None  # stop using it before the coordinator hears of it
        self._request("coordinator", (op.lease_id,), "release")
        return True

    # -- replies -------------------------------------------------------------------------------

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        kind, req_id = payload[0], payload[1]
        op = self.op
        if op is None or self.requests.get(req_id) != op.id:
            return  # an answer to something this client has stopped waiting for
        if kind == "granted":
            token = payload[2]
            sent = op.sent[req_id]
            writes = self.rng.randint(1, self.world.options.writes_per_lease_max)
            self.lease = _Lease(op.scope, token, op.lease_id, sent + self.ttl_ms * _MS - self.margin_ns, sent, writes)
            self._finish("ok", token=token.encode())
        elif kind == "queued":
            if op.polling or req_id != max(op.sent):
                return  # a duplicate, or an answer overtaken by a newer poll
            if self.clock.now_ns() < op.wait_until_ns:
                op.polling = True
                self.timer(self.world.options.poll_ms * _MS, self._poll, op.id)
            else:
                self._finish("info", error="gave-up-waiting")
        elif kind == "timeout":
            self._finish("fail", error="lock-timeout")
        elif kind == "busy":
            self._finish("fail", error="limit-exceeded")
        elif kind == "ok":
            self._finish("ok")
        elif kind == "rejected":
            reason, high_water = payload[2], payload[3]
            if reason == "stale":
                self._finish("fail", error="stale-token", high_water=high_water)
                if self.lease is not None and self.lease.token == op.token:
                    self._drop_lease(f"write rejected, high-water {high_water}")  # K3
            else:
                self._finish("fail", error=reason)
        elif kind == "value":
            self._finish("ok", value=payload[2])
        elif kind == "renewed":
            lease = self.lease
            if lease is not None and lease.lease_id == op.lease_id:
                lease.deadline_ns = op.sent[req_id] + self.ttl_ms * _MS - self.margin_ns
            self._finish("ok")
        elif kind == "not-holder":
            if self.lease is not None and self.lease.lease_id == op.lease_id:
                self._drop_lease("renew refused: not the holder")
            self._finish("fail", error="not-holder")
        elif kind == "released":
            self._finish("ok")

    def _poll(self, op_id: int) -> None:
        if self.op is not None and self.op.id == op_id:
            self.op.polling = False
            self._send_acquire()

    def _on_timeout(self, op_id: int, req_id: int) -> None:
        op = self.op
        if op is None or op.id != op_id or max(op.sent) != req_id:
            return
        if op.kind == "write" and op.attempts <= self.world.options.write_retries and op.token not in self.old_tokens:
            if self.lease is not None and self.lease_valid():
                self._send_write(op.id)  # same idempotency key: at most once (R3)
                return
        if op.kind == "acquire" and self.clock.now_ns() < op.wait_until_ns:
            self._send_acquire()  # the same lease id: a repeat never mints a second token
            return
        self._finish("info", error="timeout")

    # -- the workload ------------------------------------------------------------------------------

    def next_action(self) -> None:
        world = self.world
        if self.op is not None or world.quiescing or not self.autopilot:
            return
        o = world.options
        rng = self.rng
        if self.lease is None or not self.lease_valid():
            self.begin_acquire(rng.choice(world.scopes), rng.randint(0, 2 * o.ttl_ms))
            return
        lease = self.lease
        now = self.clock.now_ns()
        if now - lease.renew_sent_ns >= self.ttl_ms * _MS // 3:
            self.begin_renew()
            return
        if lease.writes_left <= 0:
            if rng.random() < 0.8:
                self.begin_release()
            else:
                self._drop_lease("walks away without releasing")
                self.timer(rng.randint(0, o.think_max_ms * _MS), self.next_action)
            return
        key = rng.choice(world.keys)
        roll = rng.random()
        if roll < o.read_probability:
            self.begin_read(rng.choice(world.scopes), key)
        elif o.misuse_probability and roll < o.read_probability + o.misuse_probability and len(world.scopes) > 1:
            other = rng.choice([s for s in world.scopes if s != lease.scope])
            self.begin_write(key, scope=other)
        elif o.stale_write_probability and roll > 1 - o.stale_write_probability and self.old_tokens:
            self.begin_write(key, stale=True)
        else:
            self.begin_write(key)
