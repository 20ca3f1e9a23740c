"""Deterministic simulation of the whole protocol, every knob drawn from one seed.

`run_seed(seed)` builds a `World` — a coordinator running the real lease
engine (`stockade.core.engine.LeaseEngine` over the in-memory record store),
stockade's fenced store as a model applying the real fence rule, and
1–5 clients following the documented client protocol — over a simulated
clock per process and a simulated network, and lets a nemesis loose on it:
message loss, delay, duplication and reordering, partitions, crashes and
restarts of the coordinator (with failover to a host with another clock)
and of the resource, restores of the resource from older backups, process
pauses past lease expiry, clock drift and forward jumps. Which faults are on,
and how hard, is itself drawn from the seed ("swarm" testing: most runs
switch some faults off, which finds bugs that a constant mix of every fault
hides).

At the end the faults heal, the world drains, a final read takes the store's
contents, and the checkers judge the history: P1–P7, P9 and P10 (`checkers.check`;
the world's scopes are the slots of one semaphore) and fenced-register
linearizability (`linearizability.check_linearizable`).

Each seed runs two worlds with the same drawn faults: the plain one above, and
the world of one read/write lock (`SimOptions.rwlock_world`), whose clients
take the lock as readers and writers (`_sim_rwlock`), judged by the same
checkers and P11 (`stockade.testing.rwlock_holds`); P10 there counts the
lock's read slots.

The processes live in `_sim_coordinator`, `_sim_nodes` (the resource) and
`_sim_client`; the knobs in `_sim_options`; the narrated trace in
`_sim_narrate`. The controls come from the one registry,
`stockade.testing.mutants.MUTANTS`.

Only ``random.Random(seed)`` is used, never the wall clock, and nothing
iterates a ``set`` of strings, so ``stockade sim --seed S`` replays a run
exactly, on any machine and under any ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stockade.coordinators._mint import new_cluster_id
from stockade.core.errors import InvalidArgument
from stockade.core.leases import LeasePolicy
from stockade.testing._sim_client import Client
from stockade.testing._sim_coordinator import Coordinator
from stockade.testing._sim_narrate import narrate
from stockade.testing._sim_nodes import Node, Resource
from stockade.testing._sim_options import SimOptions
from stockade.testing._sim_rwlock import GATE, READER_KEY, WRITER_KEY, RwClient, slot_scopes
from stockade.testing.checkers import CheckResult, Violation, check
from stockade.testing.clock import SimClock, SimTime
from stockade.testing.history import History
from stockade.testing.linearizability import check_linearizable
from stockade.testing.mutants import MUTANTS, PORT_SEAMS, RWLOCK_SEAMS, Seam, simulated
from stockade.testing.mutants import mutant as find_mutant
from stockade.testing.network import SimNetwork

__all__ = [
    "SimOptions",
    "World",
    "RunResult",
    "Campaign",
    "run_seed",
    "run_campaign",
    "narrate",
    "replay_command",
    "MUTANTS",
]

_MS = 1_000_000
_S = 1_000_000_000


class World:
    """Everything in one simulated run: true time, the event queue, the processes, the history.

    Args:
        seed: the only source of randomness.
        options: the knobs (default: drawn from ``seed`` by `SimOptions.swarm`).
        mutant: a name from `stockade.testing.mutants.MUTANTS`, or None for the real protocol.
        manual_network: messages wait for `deliver`/`drop`/`duplicate` (for stateful tests).
        autopilot: clients run the built-in workload and the nemesis runs; off for stateful tests.
    """

    def __init__(
        self,
        seed: int,
        options: SimOptions | None = None,
        *,
        mutant: str | None = None,
        manual_network: bool = False,
        autopilot: bool = True,
    ) -> None:
        found = find_mutant(mutant)  # refuses an unknown name
        if found is not None and found.seam in PORT_SEAMS:
            raise InvalidArgument("mutant", f"{mutant!r} breaks a client port the simulator does not model "
                                            f"(it runs on the real backend); the simulator's: {', '.join(simulated())}")
        self.seed = seed
        self.rng = random.Random(seed)
        self.options = options if options is not None else SimOptions.swarm(self.rng)
        self.mutant = mutant
        self.time = SimTime()
        self.history = History()
        self.audit: list[tuple[str, int, str, int]] = []
        self.issued: list[tuple[str, int]] = []
        self.quiescing = False
        self.steps = 0
        self.lease_ns = 0
        self._events: list[tuple[int, int, Node | None, int, Callable[..., None], tuple[Any, ...]]] = []
        self._event_seq = 0
        self._request_seq = 0
        self._streams: dict[str, random.Random] = {}
        o = self.options
        # The scopes are the slots of one semaphore (P10: at most `semaphore_slots` holders at once); a control
        # that miscounts the slots (`Seam.SEMAPHORE_SLOTS`) gives the clients one more than it admits.
        self.semaphore_slots = o.scopes
        extra = 1 if found is not None and found.seam is Seam.SEMAPHORE_SLOTS else 0
        self.scopes = [f"s{i}" for i in range(o.scopes + extra)]
        self.keys = [f"k{i}" for i in range(o.keys)]
        #: The world of one read/write lock (P11): its data and check-ins in the gate scope; P10 counts its
        #: read slots (the readers' scopes: one more under a control that miscounts them).
        self.rwlock_scope: str | None = None
        self.semaphore_scopes: list[str] | None = None
        if o.rwlock_readers:
            self.rwlock_scope = GATE
            self.semaphore_slots = o.rwlock_readers
            self.semaphore_scopes = slot_scopes(o.rwlock_readers + extra)
            self.scopes = [GATE]
            self.keys += [READER_KEY, WRITER_KEY]
        self.cluster = new_cluster_id(self.rng)
        self.network = SimNetwork(self.rng_for("network"), o.network, manual=manual_network)
        self.nemesis_rng = self.rng_for("nemesis")
        self.coordinator = Coordinator(self, self._new_clock(), cluster=self.cluster,
                                       policy=LeasePolicy(lock_delay_ms=o.lock_delay_ms))
        self.resource = Resource(self, self._new_clock(), cluster=self.cluster)
        kind = RwClient if o.rwlock_readers else Client
        self.clients = [kind(self, i, self._new_clock(), autopilot=autopilot) for i in range(o.clients)]
        self.nodes: dict[str, Node] = {"coordinator": self.coordinator, "resource": self.resource}
        self.nodes.update((c.name, c) for c in self.clients)
        self._held = 0
        self._held_since = 0
        if autopilot:
            self._start_nemesis()

    # -- plumbing ------------------------------------------------------------------------------

    def rng_for(self, name: str) -> random.Random:
        """An independent stream per component, derived from the seed (stable under new draws elsewhere)."""
        if name not in self._streams:
            self._streams[name] = random.Random(f"{self.seed}/{name}")
        return self._streams[name]

    def _new_clock(self) -> SimClock:
        rng = self.rng_for("clocks")
        top = self.options.drift_ppm_max
        return SimClock(self.time, offset_ns=rng.randint(1, 10_000) * _S // 10,
                        drift_ppm=rng.randint(-top, top) if top else 0)

    def next_request_id(self) -> int:
        self._request_seq += 1
        return self._request_seq

    def schedule(self, at_ns: int, node: Node | None, incarnation: int, fn: Callable[..., None],
                 args: tuple[Any, ...] = ()) -> None:
        self._event_seq += 1
        heapq.heappush(self._events, (at_ns, self._event_seq, node, incarnation, fn, args))

    def narrate(self, process: str, text: str) -> None:
        """A protocol event worth telling in a trace (kept in the history as a nemesis-free note)."""
        self.history.records.append({"t_ns": self.time.now_ns, "process": "note", "type": "info", "f": "note",
                                     "value": f"{process} {text}"})

    def pause(self, node: Node, duration_ns: int, *, reason: str) -> None:
        """Stop ``node`` (GC, swap, SIGSTOP) for ``duration_ns`` of true time; its clock runs on."""
        node.paused_until_ns = max(node.paused_until_ns, self.time.now_ns + duration_ns)
        self.history.nemesis(self.time.now_ns, "pause", value={"process": node.name, "ms": duration_ns // _MS,
                                                                "reason": reason})

    # -- running -------------------------------------------------------------------------------

    def _account(self, now: int) -> None:
        if self._held:
            self.lease_ns += self._held * (now - self._held_since)
        self._held_since = now
        self._held = self.coordinator.held_scopes()

    def step(self) -> bool:
        """Run the earliest event (a timer or a message delivery). False when nothing is left."""
        events = self._events
        due_msg = self.network.next_due_ns()
        if events and (due_msg is None or events[0][0] <= due_msg):
            at, _, node, incarnation, fn, args = heapq.heappop(events)
            self.time.advance_to(at)
            self.steps += 1
            if node is not None:
                if node.incarnation != incarnation or not node.up:
                    return True
                if node.paused_until_ns > at:
                    self.schedule(node.paused_until_ns, node, incarnation, fn, args)
                    return True
            fn(*args)
        elif due_msg is not None:
            self.time.advance_to(due_msg)
            self.steps += 1
            message = self.network.pop_due()
            if message is not None:
                self._deliver(message.dst, message.src, message.payload)
        else:
            return False
        self._account(self.time.now_ns)
        return True

    def _deliver(self, dst: str, src: str, payload: tuple[Any, ...]) -> None:
        node = self.nodes[dst]
        if not node.up:
            return
        if node.paused_until_ns > self.time.now_ns:
            # A stopped process's socket buffer holds the message until it runs again.
            self.schedule(node.paused_until_ns, node, node.incarnation, node.receive, (src, payload))
            return
        node.receive(src, payload)

    def next_due_ns(self) -> int | None:
        candidates = [t for t in (self._events[0][0] if self._events else None, self.network.next_due_ns())
                      if t is not None]
        return min(candidates) if candidates else None

    def run_until(self, t_ns: int) -> None:
        while True:
            due = self.next_due_ns()
            if due is None or due > t_ns:
                break
            self.step()
        if t_ns > self.time.now_ns:
            self.time.advance_to(t_ns)
            self._account(t_ns)

    def run(self) -> None:
        """The whole run: faults for ``duration_ms``, then heal, drain, and take the final read."""
        o = self.options
        end = o.duration_ms * _MS
        self.run_until(end)
        self.heal_all()
        self.quiescing = True
        drain = end + 4 * o.ttl_ms * _MS + o.network.slow_delay_max_ns + 5 * o.ttl_ms * _MS
        while self.next_due_ns() is not None and self.time.now_ns < drain:
            if not any(c.op is not None for c in self.clients) and self.network.in_flight() == 0:
                break
            self.step()
        self.final_read()

    def final_read(self) -> None:
        resource = self.resource
        if not resource.up:
            resource.restart()
        resource.fsync()
        for scope in self.scopes:
            for key in self.keys:
                now = self.time.now_ns
                self.history.invoke(now, "final", "read", scope=scope, key=key, final=True)
                self.history.complete(now, "final", "ok", value=resource.durable.values.get((scope, key)))

    # -- the nemesis ---------------------------------------------------------------------------

    def _start_nemesis(self) -> None:
        o = self.options
        rates = {
            "partition": o.partition_per_s,
            "crash-coordinator": o.coordinator_crash_per_s,
            "crash-resource": o.resource_crash_per_s,
            "backup": o.backup_per_s if o.restore_per_s else 0.0,
            "restore": o.restore_per_s,
            "pause": o.pause_per_s,
            "clock-jump": o.clock_jump_per_s,
        }
        for fault, rate in rates.items():
            if rate:
                self._arm(fault, rate)

    def _arm(self, fault: str, rate: float) -> None:
        delay = int(self.nemesis_rng.expovariate(rate) * _S)
        if self.time.now_ns + delay < self.options.duration_ms * _MS:
            self.schedule(self.time.now_ns + delay, None, 0, self._fault, (fault, rate))

    def _fault(self, fault: str, rate: float) -> None:
        if not self.quiescing:
            getattr(self, "_do_" + fault.replace("-", "_"))()
            self._arm(fault, rate)

    def _outage_ns(self) -> int:
        return self.nemesis_rng.randint(1, 3 * self.options.ttl_ms) * _MS

    def _do_partition(self) -> None:
        rng = self.nemesis_rng
        names = list(self.nodes)
        rng.shuffle(names)
        cut = rng.randint(1, len(names) - 1)
        side_a, side_b = names[:cut], names[cut:]
        one_way = rng.random() < 0.3
        self.network.partition(side_a, side_b, one_way=one_way)
        self.history.nemesis(self.time.now_ns, "partition", value={"a": side_a, "b": side_b, "one_way": one_way})
        self.schedule(self.time.now_ns + self._outage_ns(), None, 0, self._heal_partition)

    def _heal_partition(self) -> None:
        if self.network.cut:
            self.network.heal()
            self.history.nemesis(self.time.now_ns, "heal")

    def _do_crash_coordinator(self) -> None:
        if not self.coordinator.up:
            return
        self.coordinator.crash()
        self.history.nemesis(self.time.now_ns, "crash-coordinator")
        self.schedule(self.time.now_ns + self._outage_ns(), None, 0, self._restart_coordinator)

    def _restart_coordinator(self) -> None:
        coordinator = self.coordinator
        if coordinator.up:
            return
        failover = self.nemesis_rng.random() < 0.5
        clock = self._new_clock() if failover else coordinator.clock
        coordinator.restart(clock, same_clock=not failover)
        self.history.nemesis(self.time.now_ns, "restart-coordinator", value={
            "failover": failover, "last_token": {s: r.last_token for s, r in coordinator.durable.items()}})

    def _do_crash_resource(self) -> None:
        if not self.resource.up:
            return
        self.resource.crash()
        self.history.nemesis(self.time.now_ns, "crash-resource", value={"commit_seq": len(self.audit)})
        self.schedule(self.time.now_ns + self._outage_ns(), None, 0, self._restart_resource)

    def _restart_resource(self) -> None:
        resource = self.resource
        if resource.up:
            return
        resource.restart()
        self.history.nemesis(self.time.now_ns, "restart-resource", value={
            "high_water": {s: resource.durable.high_water.get(s, 0) for s in self.scopes},
            "commit_seq": len(self.audit)})

    def _do_backup(self) -> None:
        if self.resource.up:
            self.resource.backup()

    def _do_restore(self) -> None:
        resource = self.resource
        if not resource.backups or not resource.up:
            return
        index = self.nemesis_rng.randrange(len(resource.backups))
        # The operator reads the coordinator's latest issued tokens: the fence floor (R4).
        floors = {s: r.last_token for s, r in self.coordinator.durable.items() if s in self.scopes}
        report = resource.restore(index, floors)
        self.history.nemesis(self.time.now_ns, "restore", value=report)

    def _do_pause(self) -> None:
        rng = self.nemesis_rng
        node = rng.choice(list(self.nodes.values()))
        self.pause(node, rng.randint(1, 5) * self.options.ttl_ms * _MS, reason="nemesis")

    def _do_clock_jump(self) -> None:
        rng = self.nemesis_rng
        # The lock's world keeps K2's assumption: the coordinator's clock is not jumped (its leases would
        # end early against every client's local deadline); the clients' clocks are.
        nodes = [n for n in self.nodes.values() if not (self.rwlock_scope and n is self.coordinator)]
        node = rng.choice(nodes)
        delta = rng.randint(1, 2 * self.options.ttl_ms) * _MS
        node.clock.jump(delta)
        self.history.nemesis(self.time.now_ns, "clock-jump", value={"process": node.name, "ms": delta // _MS})

    def heal_all(self) -> None:
        self._heal_partition()
        self._restart_coordinator()
        self._restart_resource()

    # -- manual control (stateful tests) -------------------------------------------------------

    def advance(self, delta_ns: int) -> None:
        """Let ``delta_ns`` of true time pass, firing due timers (and due messages in automatic mode)."""
        self.run_until(self.time.now_ns + delta_ns)

    def deliver(self, index: int) -> None:
        """Manual network: deliver pending message ``index`` now."""
        message = self.network.take(index)
        if (message.src, message.dst) in self.network.cut:
            return
        self._deliver(message.dst, message.src, message.payload)

    def check(self) -> CheckResult:
        return check(self.history.records, audit=self.audit, issued=self.issued, cluster=self.cluster,
                     semaphore_slots=self.semaphore_slots, semaphore_scopes=self.semaphore_scopes,
                     rwlock_scope=self.rwlock_scope)


# --- running seeds ------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One seed's run: its size and its verdict."""

    seed: int
    mutant: str | None
    options: SimOptions
    steps: int
    simulated_ns: int
    lease_ns: int
    operations: int
    violations: list[Violation]
    undecided: list[str]
    history: list[dict[str, Any]]
    audit: list[tuple[str, int, str, int]]
    issued: list[tuple[str, int]]
    figures: dict[str, Any]
    #: Which world the history, options and violations are of: "plain" or "rwlock" (the read/write lock's).
    world: str = "plain"
    #: Steps per world run for the seed (the size figures above add up every world).
    steps_by_world: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def run_seed(seed: int, *, mutant: str | None = None, options: SimOptions | None = None,
             linearizability: bool = True) -> RunResult:
    """Simulate one seed and judge its histories with every checker.

    Without a control, the seed runs the plain world, then (unless it failed, or ``options`` are given) the
    world of the read/write lock with the same seed's faults (`SimOptions.rwlock_world`). A control runs in
    the world of its seam: the lock's (`RWLOCK_SEAMS`) or the plain one.

    Returns:
        The plain world's result when it has violations (or is the only one run), else the lock world's;
        its size figures add up the worlds run, ``steps_by_world`` tells them apart.
    """
    found = find_mutant(mutant)
    if found is not None and found.seam in RWLOCK_SEAMS:
        return _run_world(World(seed, options or SimOptions.rwlock_world(seed), mutant=mutant), linearizability)
    result = _run_world(World(seed, options, mutant=mutant), linearizability)
    if options is not None or found is not None or result.violations:
        return result
    rw = _run_world(World(seed, SimOptions.rwlock_world(seed)), linearizability)
    chosen = rw if rw.violations else result
    chosen.steps_by_world = {"plain": result.steps, "rwlock": rw.steps}
    chosen.steps, chosen.simulated_ns = result.steps + rw.steps, result.simulated_ns + rw.simulated_ns
    chosen.lease_ns, chosen.operations = result.lease_ns + rw.lease_ns, result.operations + rw.operations
    chosen.undecided = result.undecided + rw.undecided
    return chosen


def _run_world(world: World, linearizability: bool) -> RunResult:
    world.run()
    seed, mutant = world.seed, world.mutant
    records = world.history.records
    verdict = world.check()
    violations = list(verdict.violations)
    undecided: list[str] = []
    if linearizability:
        lin = check_linearizable(records, steps_max=200_000)
        violations += lin.violations
        undecided = lin.undecided
    return RunResult(
        seed=seed,
        mutant=mutant,
        options=world.options,
        steps=world.steps,
        simulated_ns=world.time.now_ns,
        lease_ns=world.lease_ns,
        operations=verdict.figures.get("operations", 0),
        violations=violations,
        undecided=undecided,
        history=records,
        audit=world.audit,
        issued=world.issued,
        figures=verdict.figures,
        world="rwlock" if world.rwlock_scope else "plain",
        steps_by_world={"rwlock" if world.rwlock_scope else "plain": world.steps},
    )


@dataclass
class Campaign:
    """Many seeds: totals, and the first failing run."""

    examples: int = 0
    steps: int = 0
    simulated_ns: int = 0
    lease_ns: int = 0
    operations: int = 0
    undecided: int = 0
    elapsed_s: float = 0.0
    failures: list[RunResult] = field(default_factory=list)

    @property
    def lease_hours(self) -> float:
        return self.lease_ns / 3_600 / _S

    @property
    def violations(self) -> int:
        return sum(len(f.violations) for f in self.failures)

    def summary(self) -> str:
        rate = max(self.elapsed_s, 1e-9)
        return (f"examples {self.examples}, steps {self.steps}, simulated lease-hours {self.lease_hours:.3f}, "
                f"operations {self.operations}, violations {self.violations}"
                + (f", undecided scopes {self.undecided}" if self.undecided else "")
                + f" — {self.elapsed_s:.1f} s wall: {self.examples / rate:.1f} seeds/s, "
                  f"{self.steps / rate:,.0f} steps/s, {self.lease_hours / rate:.4f} lease-hours/s")


def run_campaign(
    seeds: Any,
    *,
    mutant: str | None = None,
    seconds: float | None = None,
    stop_at_first: bool = True,
    linearizability: bool = True,
    on_result: Callable[[RunResult], None] | None = None,
) -> Campaign:
    """Run ``seeds`` (any iterable of ints) until done, out of ``seconds`` of wall time, or a failure.

    The wall clock only bounds how many seeds run; it never enters a simulation.
    """
    campaign = Campaign()
    started = time.monotonic()
    for seed in seeds:
        if seconds is not None and time.monotonic() - started >= seconds:
            break
        result = run_seed(seed, mutant=mutant, linearizability=linearizability)
        campaign.examples += 1
        campaign.steps += result.steps
        campaign.simulated_ns += result.simulated_ns
        campaign.lease_ns += result.lease_ns
        campaign.operations += result.operations
        campaign.undecided += len(result.undecided)
        if on_result is not None:
            on_result(result)
        if not result.ok:
            campaign.failures.append(result)
            if stop_at_first:
                break
    campaign.elapsed_s = time.monotonic() - started
    return campaign


# --- telling what happened --------------------------------------------------------------------


def replay_command(seed: int, mutant: str | None = None) -> str:
    return f"stockade sim --seed {seed}" + (f" --mutant {mutant}" if mutant else "")
