"""The simulated coordinator node: the real lease engine over the in-memory record store.

The node runs `stockade.core.engine.LeaseEngine` over
`stockade.coordinators.memory.MemoryRecords`, with the node's `SimClock`; it
has no lease logic of its own. What it adds is the process around the engine:

- **a disk**: every unit the record store commits is copied, before the
  engine returns (``on_commit``), into ``durable``, the node's disk. So a
  token is durable before any answer leaves (C1). A release's unit is the
  exception, as in `stockade serve`: it is answered at once and waits in
  ``deferred`` until the next unit is written (it goes first, in order) or
  until ``release_lag_ms`` has passed since the first one waiting.
- **crash**: the engine and its records (the process's memory) are gone; the
  disk stays. Nothing the engine returned is lost but a deferred release
  whose lag had not run out (its lease is then held a full TTL from the
  restart, C3), and nothing uncommitted survives (a refused unit is undone by
  the store and never reaches the disk).
- **restart**: a new record store is loaded from the disk, a new engine is
  opened on the node's clock (a failover brings another host's clock), and
  the one restart rule is applied: `LeaseEngine.recover` (C3, C5).
- **an issue log and a lease log**: every minted token goes to the world's
  issue log (the P1/P3 oracle, also for grants whose reply is lost), and every
  grant, renew and release the engine committed, and every crash and restart,
  is recorded in the history as a ``process: "coordinator"`` record with the
  coordinator's own clock reading (the P9 oracle, see
  `stockade.testing.lock_delay`).

A control (`stockade.testing.mutants.MUTANTS`) plugs in at its seam: a grant
rule (``acquire_rule``), a record-store wrapper opened at restart, or a disk
that is written only now and then instead of at each commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stockade.coordinators.memory import Change, MemoryRecords
from stockade.core.engine import LeaseEngine, RecordStore
from stockade.core.errors import LimitExceeded, NotHolder
from stockade.core.leases import Granted, LeasePolicy, Queued, ScopeRecord
from stockade.testing._sim_nodes import Node
from stockade.testing.clock import SimClock
from stockade.testing.mutants import Seam
from stockade.testing.mutants import mutant as find_mutant

if TYPE_CHECKING:
    from stockade.testing.sim import World

__all__ = ["Coordinator"]

_MS = 1_000_000


class Coordinator(Node):
    """The lease engine on a simulated host, with a disk that survives crashes (C1, C3, C5)."""

    def __init__(self, world: World, clock: SimClock, *, cluster: str, policy: LeasePolicy) -> None:
        super().__init__(world, "coordinator", clock)
        self.cluster = cluster
        self.policy = policy
        self.mutant = find_mutant(world.mutant)
        self.volatile = self.mutant is not None and self.mutant.seam is Seam.COMMIT
        self.durable: dict[str, ScopeRecord] = {}  # the disk
        # Released units not on the disk yet, each with the clock reading of its release (`stockade serve`'s
        # deferred releases), and whether the unit being committed is a release's.
        self.deferred: list[tuple[int, Sequence[Change]]] = []
        self.releasing = False
        self.release_lag_ns = world.options.release_lag_ms * _MS
        self.clock_epoch = 0  # which host's clock the engine reads (a failover brings another)
        self.wait_deadlines: dict[str, int] = {}
        self.memory, self.engine = self._open()
        if self.volatile:
            self.timer(world.options.checkpoint_ms * _MS, self._checkpoint)

    # -- the process around the engine ---------------------------------------------------------

    def _open(self) -> tuple[MemoryRecords, LeaseEngine]:
        memory = MemoryRecords(dict(self.durable), on_commit=self._on_commit)
        store: RecordStore = memory
        mutant = self.mutant
        if mutant is not None and mutant.seam is Seam.RECORD_STORE and mutant.wrap is not None:
            store = mutant.wrap(memory)
        engine = LeaseEngine(store, cluster_id=self.cluster, clock=self.clock, policy=self.policy)
        if mutant is not None and mutant.seam is Seam.ACQUIRE_RULE and mutant.rule is not None:
            engine.acquire_rule = mutant.rule
        return memory, engine

    def _on_commit(self, changes: Sequence[Change]) -> None:
        # C1: the committed unit is on disk before the engine returns (the control forgets to); a release's
        # waits for the next one, or its lag.
        if self.volatile:
            return
        if self.releasing and self.release_lag_ns:
            self.deferred.append((self.clock.now_ns(), changes))
            return
        for _, waiting in self.deferred:
            self._write(waiting)
        self.deferred = []
        self._write(changes)

    def _write(self, changes: Sequence[Change]) -> None:
        durable = self.durable
        for old, new in changes:
            if new is None:  # a forgotten scope
                if old is not None:
                    durable.pop(old.scope, None)
            else:
                durable[new.scope] = new

    def _lose_deferred(self) -> None:
        """At a crash: the deferred releases that `stockade serve` would have committed by now (the lag of the
        first of a batch ran out: its timer committed the whole batch) reach the disk; the others are lost."""
        now, lag = self.clock.now_ns(), self.release_lag_ns
        started: int | None = None
        for at_ns, changes in self.deferred:
            if started is None or at_ns >= started + lag:
                started = at_ns  # the server's timer had fired before this one: a batch (and a timer) of its own
            if started + lag > now:
                break  # its batch's timer had not fired: it, and every release after it, are lost
            self._write(changes)
        self.deferred = []

    def _checkpoint(self) -> None:
        self.durable = self.memory.snapshot()
        self.timer(self.world.options.checkpoint_ms * _MS, self._checkpoint)

    def _log(self, f: str, scope: str | None = None, **value: Any) -> None:
        value["clock"] = self.clock_epoch
        value["at_ns"] = self.clock.now_ns()
        record: dict[str, Any] = {"t_ns": self.world.time.now_ns, "process": "coordinator", "type": "info", "f": f}
        if scope is not None:
            record["scope"] = scope
        record["value"] = value
        self.world.history.records.append(record)

    def crash(self) -> None:
        """``kill -9``: the engine and its memory are gone; the disk stays (releases within their lag lost)."""
        self._lose_deferred()
        self._log("crash")
        self.up = False
        self.incarnation += 1
        self.wait_deadlines = {}

    def restart(self, clock: SimClock, *, same_clock: bool) -> None:
        """Come back from the disk and apply the one restart rule (`LeaseEngine.recover`)."""
        self.clock = clock
        if not same_clock:
            self.clock_epoch += 1
        self.up = True
        self.memory, self.engine = self._open()
        self.engine.recover(same_clock=same_clock)
        self._log("restart", same_clock=same_clock)
        if self.volatile:
            self.timer(self.world.options.checkpoint_ms * _MS, self._checkpoint)

    def held_scopes(self) -> int:
        if not self.up:
            return 0
        now = self.clock.now_ns()
        return sum(1 for r in self.memory.records.values() if r.lease is not None and r.lease.expires_ns > now)

    # -- requests -------------------------------------------------------------------------------

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        kind, req_id = payload[0], payload[1]
        if kind == "acquire":
            self._acquire(src, payload)
        elif kind == "renew":
            lease_id = payload[2]
            try:
                lease = self.engine.renew(lease_id)
            except NotHolder:
                self.send(src, ("not-holder", req_id))
                return
            self._log("renew", lease.scope, lease=lease_id, expires_ns=lease.expires_ns)
            self.send(src, ("renewed", req_id))
        elif kind == "release":
            lease_id = payload[2]
            scope = self.memory.scope_of_lease(lease_id)
            self.releasing = True
            try:
                outcome = self.engine.release(lease_id)
            finally:
                self.releasing = False
            if outcome.released and scope is not None:
                self._log("release", scope, lease=lease_id)
            self.send(src, ("released", req_id, outcome.released))

    def _acquire(self, src: str, payload: tuple[Any, ...]) -> None:
        _, req_id, scope, lease_id, holder, ttl_ms, wait_ms = payload
        now = self.clock.now_ns()
        deadline = self.wait_deadlines.setdefault(lease_id, now + wait_ms * _MS)
        before = self.memory.peek(scope)
        previous = before.lease if before is not None else None
        try:
            outcome = self.engine.try_acquire(scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms,
                                              wait_deadline_ns=deadline)
        except LimitExceeded:
            self.send(src, ("busy", req_id))
            return
        if isinstance(outcome, Granted):
            lease = outcome.lease
            if previous is None or previous.lease_id != lease_id or previous.expires_ns <= now:
                self.world.issued.append((scope, lease.token.value))
                self._log("grant", scope, lease=lease_id, token=lease.token.value, expires_ns=lease.expires_ns,
                          lock_delay_ms=self.policy.lock_delay_ms)
            else:
                # A repeat (the first answer was lost or late): the client counts its deadline from this
                # request's send time (K2), so the lease is handed over renewed, as the server hands over
                # a grant made while no request watched its wait (server/_tickets.py).
                lease = self.engine.renew(lease_id)
                self._log("renew", scope, lease=lease_id, expires_ns=lease.expires_ns)
            self.send(src, ("granted", req_id, lease.token, lease_id))
        elif isinstance(outcome, Queued):
            self.send(src, ("queued", req_id))
        else:
            self.wait_deadlines.pop(lease_id, None)
            self.send(src, ("timeout", req_id))
