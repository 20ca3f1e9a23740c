"""The simulated client: the documented client protocol (K1–K3) and the built-in workload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.core.tokens import FencingToken
from stockade.testing._sim_nodes import Node
from stockade.testing.clock import SimClock

if TYPE_CHECKING:
    from stockade.testing.sim import World

__all__ = ["Client"]

_MS = 1_000_000


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
                                  token=op.token.encode())
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
