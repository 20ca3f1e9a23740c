"""The simulated read/write lock's clients: `stockade.ReadWriteLock`'s protocol, step by step (docs/rwlock.md).

A world of the read/write lock (`stockade.testing.sim`, ``SimOptions.rwlock_readers`` above 0) has one lock:
the gate scope `GATE` and the read slots ``sem.rw.l.0`` .. ``sem.rw.l.<N-1>``. Each client takes it again and
again, as a reader or a writer, exactly as `AsyncReadWriteLock` does, one request at a time:

- **reader**: take the gate (first in, first out with the writers, C4); check in: a fenced write of the gate's
  token at `READER_KEY` of the gate scope; take a free read slot; look at the gate's lease (``raise_if_lost``:
  its local deadline, K2) and give the slot back if it was lost; give the gate back. It holds the slot while
  it reads the data keys, then *validates*: a read of `WRITER_KEY`, refused if a newer writer checked in.
- **writer**: take the gate and keep it; take each read slot in turn and give it back at once (the drain);
  check in at `WRITER_KEY`; look at the gate's lease; then write the data keys with the gate's token (K1)
  until it releases the gate.

Every step is an ordinary request of the simulated client (`stockade.testing._sim_client.Client`: acquire,
renew, release, fenced write, read), so the network, the pauses and the crashes reach every step, and the
older properties judge them too. Beside them, a keepalive renews the gate (and a reader's slot while it
holds it) every TTL/3 in the background, as the real lease's does; a refused renewal marks the lease lost.

When a step's outcome makes the lock's answer known, the client writes a ``process: "rwlock"`` record into
the history, which P11 (`stockade.testing.rwlock_holds`) reads beside the coordinator's lease log:
``f: "hold"`` when an acquisition returned (mode, token, the hold's lease, every lease granted on the way)
and ``f: "validate"`` when a reader's validation answered (its token, the writer token it saw, the verdict).

A control plugs in at `Seam.RWLOCK_DRAIN` (writers that skip the drain), `Seam.RWLOCK_CHECK_IN` (writers
that skip their check-in) and `Seam.SEMAPHORE_SLOTS` (readers that take one slot more than the writers drain).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.client._async.rwlock import READER_KEY, WRITER_KEY
from stockade.testing._sim_client import Client, _Lease
from stockade.testing.clock import SimClock
from stockade.testing.mutants import Seam
from stockade.testing.mutants import mutant as find_mutant

if TYPE_CHECKING:
    from stockade.testing.sim import World

__all__ = ["GATE", "READER_KEY", "WRITER_KEY", "RwClient", "slot_scopes"]

_MS = 1_000_000
#: The gate scope of the world's one lock (`AsyncReadWriteLock(..., "l")`): every token of the lock, its data.
GATE = "rw.l"


def slot_scopes(count: int) -> list[str]:
    """The first ``count`` read slots' scopes (`AsyncSemaphore.scope_of` of the gate's semaphore)."""
    return [f"sem.{GATE}.{i}" for i in range(count)]


class RwClient(Client):
    """One client of the read/write lock: readers and writers in turn, every step one request (K1–K3)."""

    def __init__(self, world: World, index: int, clock: SimClock, *, autopilot: bool) -> None:
        super().__init__(world, index, clock, autopilot=autopilot)
        found = find_mutant(world.mutant)
        seam = found.seam if found is not None else None
        readers = world.options.rwlock_readers
        self.drain_slots = [] if seam is Seam.RWLOCK_DRAIN else slot_scopes(readers)
        self.writer_checks_in = seam is not Seam.RWLOCK_CHECK_IN
        self.read_slots = slot_scopes(readers + (1 if seam is Seam.SEMAPHORE_SLOTS else 0))
        self.write_share = world.options.rwlock_write_percent / 100
        self.mode = ""
        self.step = "idle"
        self.waiting_for = ""
        self.gate: _Lease | None = None
        self.slot: _Lease | None = None
        self.granted: list[str] = []
        self.deadline_ns = 0
        self.drain_index = 0
        self.reads_left = 0
        self.token = 0  # the acquisition's gate token: the reader's or the writer's token
        self.lost_tokens: set[int] = set()  # leases the coordinator or the store refused (K2, K3)
        self.validate_invoked_ns = 0
        self.check_in_key = ""
        self.last: tuple[str, str, dict[str, Any], Any] | None = None
        self.renewals: dict[int, tuple[_Lease, int]] = {}  # the keepalive's requests in flight

    # -- the driver: one request at a time, each step issued, then its outcome handled ----------------

    def _finish(self, type_: str, **fields: Any) -> None:
        op = self.op
        self.last = (op.kind if op is not None else "", type_, fields, op)
        if op is not None and op.token is not None and fields.get("error") in ("not-holder", "stale-token"):
            self.lost_tokens.add(op.token.value)  # a refused renew or write: that lease is lost, not to be revived
        super()._finish(type_, **fields)

    def _later(self) -> None:
        self.timer(0, self.next_action)

    def next_action(self) -> None:
        if self.op is not None or not self.autopilot:
            return
        last, self.last = self.last, None
        tag, self.waiting_for = self.waiting_for, ""
        if tag:
            self._handle(tag, last)
        if self.op is None and not self.waiting_for:
            self._issue()

    def _await(self, tag: str, started: bool) -> None:
        if started:
            self.waiting_for = tag
        else:
            self._later()

    def _note(self, f: str, **value: Any) -> None:
        value["client"] = self.index
        self.world.history.records.append({"t_ns": self.world.time.now_ns, "process": "rwlock", "type": "info",
                                           "f": f, "scope": GATE, "value": value})

    def _keep(self, lease: _Lease | None) -> bool:
        """Make ``lease`` the current one; False when it is lost: refused (K3) or past its local deadline (K2)."""
        self.lease = lease
        return lease is not None and lease.token.value not in self.lost_tokens and self.lease_valid()

    # -- the keepalive: in the background, as the real lease's, beside the one request of each step -------

    def _start_keepalive(self, lease: _Lease) -> None:
        self.timer(self.ttl_ms * _MS // 3, self._keepalive, lease)

    def _keepalive(self, lease: _Lease) -> None:
        """Renew ``lease`` every TTL/3 while it is the gate or the read slot held, and not lost."""
        if lease is not self.gate and lease is not self.slot:
            return
        if lease.token.value in self.lost_tokens or self.clock.now_ns() >= lease.deadline_ns:
            return  # lost: the real keepalive stops too (the next look at the lease tells its holder)
        request = self.world.next_request_id()
        self.renewals[request] = (lease, self.clock.now_ns())
        self.send("coordinator", ("renew", request, lease.lease_id))
        self._start_keepalive(lease)

    def receive(self, src: str, payload: tuple[Any, ...]) -> None:
        renewal = self.renewals.pop(payload[1], None)
        if renewal is None:
            super().receive(src, payload)
            return
        lease, sent_ns = renewal
        if payload[0] == "renewed":  # K2: good until the renewal's send time + TTL - margin
            lease.deadline_ns = max(lease.deadline_ns, sent_ns + self.ttl_ms * _MS - self.margin_ns)
        elif payload[0] == "not-holder":
            self.lost_tokens.add(lease.token.value)

    # -- issuing each step ------------------------------------------------------------------------------

    def _issue(self) -> None:
        world = self.world
        step = self.step
        if step == "idle":
            if world.quiescing:
                return
            self.mode = "write" if self.rng.random() < self.write_share else "read"
            self.deadline_ns = self.clock.now_ns() + self.rng.randint(0, 4 * self.ttl_ms) * _MS
            self.granted = []
            self.drain_index = 0
            self.step = step = "gate"
        if step == "abort":
            self._abort()
            return
        if step in ("hold", "validate", "release"):
            self._issue_held(step)
            return
        if self.gate is not None and not self._keep(self.gate):
            self._give_up("the gate's lease was lost")
            return
        if step == "gate":
            self._acquire(GATE, "gate")
        elif step == "check-in":
            self._check_in()
        elif step == "slot":
            self._acquire(self.rng.choice(self.read_slots), "slot")
        elif step == "drain":
            if self.drain_index >= len(self.drain_slots):
                self.step = "check-in"
                if self.writer_checks_in:
                    self._check_in()
                else:
                    self.check_in_key = ""
                    self._held_now()
                    self._later()
            else:
                self._acquire(self.drain_slots[self.drain_index], "drain")
        elif step in ("drain-release", "release-gate"):
            self.lease = self.slot if step == "drain-release" else self.gate
            self._await(step, self.begin_release())

    def _acquire(self, scope: str, tag: str) -> None:
        """One acquire for what is left of the acquisition's wait (polls keep its place in the queue, C4)."""
        self.begin_acquire(scope, max(0, (self.deadline_ns - self.clock.now_ns()) // _MS))
        self.waiting_for = tag

    def _check_in(self) -> None:
        """A fenced write of the gate's token at the mode's key of the gate scope (R1); its value names the token."""
        gate = self.gate
        assert gate is not None
        op = self._new_op("write")
        op.scope, op.key, op.token = GATE, READER_KEY if self.mode == "read" else WRITER_KEY, gate.token
        op.value = self.check_in_key = f"{self.index}-{op.id}-t{gate.token.value}"
        self.world.history.invoke(self.world.time.now_ns, self.index, "write", scope=GATE, key=op.key,
                                  token=gate.token.encode(), value=op.value, idempotency_key=op.value)
        self._send_write(op.id)
        self.waiting_for = "check-in"

    def _issue_held(self, step: str) -> None:
        held = self.slot if self.mode == "read" else self.gate
        if step == "release":
            self.lease = held
            if held is not None and self.rng.random() < 0.8:
                self._await("release", self.begin_release())
            else:
                self._drop_lease("walks away without releasing")
                self._end()
            return
        if step == "validate":
            self._validate()
            return
        if not self._keep(held):
            self.step = "validate" if self.mode == "read" else "release"  # a lapsed reader still validates
            self._later()
            return
        key = self.rng.choice([k for k in self.world.keys if k not in (READER_KEY, WRITER_KEY)])
        if self.mode == "read":
            if self.reads_left <= 0:
                self.step = "validate"
                self._later()
                return
            self.reads_left -= 1
            self.begin_read(GATE, key)
            self.waiting_for = "read"
        elif held is not None and held.writes_left > 0:
            self._await("write", self.begin_write(key))
        else:
            self.step = "release"
            self._later()

    def _validate(self) -> None:
        o = self.world.options
        self.waiting_for = "validate"
        if self.rng.random() < max(o.zombie_pause_probability, o.rwlock_pause_percent / 100):
            # Paused between its reads and its validation: the slot's lease may lapse and a writer get in.
            self.world.pause(self, self.rng.randint(1, 5) * o.ttl_ms * _MS, reason="between read and validate")
            self.timer(0, self._send_validate)
        else:
            self._send_validate()

    def _send_validate(self) -> None:
        self.validate_invoked_ns = self.world.time.now_ns
        self.begin_read(GATE, WRITER_KEY)

    # -- handling each outcome --------------------------------------------------------------------------

    def _handle(self, tag: str, last: tuple[str, str, dict[str, Any], Any] | None) -> None:
        ok = last is not None and last[1] == "ok"
        if tag in ("gate", "slot", "drain"):
            self._handle_acquire(tag, ok)
        elif tag == "check-in":
            if not ok:
                self._give_up("the check-in was refused or its outcome is unknown")
            elif self.mode == "read":
                self.step = "slot"
            else:
                self._held_now()
        elif tag == "drain-release":
            self.slot = None
            self.drain_index += 1
            self.step = "drain"
        elif tag == "release-gate":
            self.gate = None
            self._note("hold", mode="read", token=self.token, lease=self.slot.lease_id if self.slot else "",
                       leases=list(self.granted))
            self.reads_left = self.rng.randint(0, 3)
            if self.slot is not None:
                self._start_keepalive(self.slot)
            self.step = "hold"
        elif tag == "validate" and last is not None:
            self._validated(last)
        elif tag == "release":
            self._end()
        elif tag == "abort":
            self._abort()

    def _handle_acquire(self, tag: str, ok: bool) -> None:
        if not ok:
            if self.clock.now_ns() < self.deadline_ns and not self.world.quiescing:
                return  # the same step again (an answer lost or late): a new acquire for what is left
            self._give_up("the wait ran out")
            return
        granted = self.lease
        assert granted is not None
        self.granted.append(granted.lease_id)
        if tag == "gate":
            self.gate = granted
            self.token = granted.token.value
            self._start_keepalive(granted)
            self.step = "check-in" if self.mode == "read" else "drain"
            return
        self.slot = granted
        if tag == "drain":
            self.step = "drain-release"
            return
        self.lease = self.gate  # raise_if_lost: paused past the gate's lease, a writer may be in
        if self.gate is None or not self.lease_valid():
            self._give_up("the gate's lease was lost while the slot was taken")
            return
        self.step = "release-gate"

    def _held_now(self) -> None:
        self.lease = self.gate
        if self.gate is None or not self.lease_valid():
            self._give_up("the gate's lease was lost by the end of the acquisition")
            return
        self._note("hold", mode="write", token=self.token, lease=self.gate.lease_id, leases=list(self.granted),
                   check_in=self.check_in_key)
        self.step = "hold"

    def _validated(self, last: tuple[str, str, dict[str, Any], Any]) -> None:
        if last[1] == "ok":
            value = last[2].get("value")
            seen = int(value.rpartition("-t")[2]) if isinstance(value, str) and "-t" in value else 0
            # `AsyncReadLease.validate`: refused when the writer key's token is above the reader's.
            verdict = "refused" if seen > self.token else "ok"
            self._note("validate", token=self.token, seen=seen, verdict=verdict, invoke_ns=self.validate_invoked_ns)
        self.step = "release"

    def _give_up(self, why: str) -> None:
        self.world.narrate(self.name, f"{self.mode} acquisition failed: {why}")
        self.step = "abort"
        self._abort()

    def _abort(self) -> None:
        """Give back what the failed acquisition holds (quietly: a refused release changes nothing)."""
        for name in ("slot", "gate"):
            held = getattr(self, name)
            if held is not None:
                setattr(self, name, None)
                self.lease = held
                self._await("abort", self.begin_release())
                return
        self._end()

    def _end(self) -> None:
        self.gate = self.slot = self.lease = None
        self.step = "idle"
        if not self.waiting_for and self.op is None:
            self._later()
