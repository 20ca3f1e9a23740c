"""The simulated processes: the `Node` base and the resource, as sans-IO models.

Each node is driven by the `World` (`stockade.testing.sim`): it receives
messages and timer callbacks, reads its own `SimClock`, and sends through the
world. The resource applies the real fence rule (`stockade.core.fence`)
atomically; the coordinator (`stockade.testing._sim_coordinator`) runs the
real lease engine; the clients (`stockade.testing._sim_client`) follow the
documented client protocol (K1–K3). A control
(`stockade.testing.mutants.MUTANTS`) plugs in at the seam it names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stockade.core.fence import Accept, FenceDecision, FenceRule, Recorded, Reject, Replay, check_write, decide
from stockade.core.tokens import FencingToken
from stockade.core.values import WriteResult
from stockade.testing.clock import SimClock
from stockade.testing.mutants import Seam
from stockade.testing.mutants import mutant as find_mutant

if TYPE_CHECKING:
    from stockade.testing.sim import World

__all__ = ["Node", "Resource", "ResourceState"]

_MS = 1_000_000


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
        mutant = find_mutant(world.mutant)
        seam = mutant.seam if mutant is not None else None
        #: The comparison: the real one, or a control's (`Seam.FENCE_RULE`).
        self.fence_rule: FenceRule = decide
        if mutant is not None and seam is Seam.FENCE_RULE and mutant.rule is not None:
            self.fence_rule = mutant.rule
        #: `Seam.FENCE_UNIT`: the check on arrival, the write later without a re-check.
        self.check_then_write = seam is Seam.FENCE_UNIT
        #: `Seam.RESTORE_FLOOR`: a restore that forgets the fence floor.
        self.restore_floor = seam is not Seam.RESTORE_FLOOR
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
        if kind == "write" and self.check_then_write:
            early = self._decide(payload[6], payload[2])  # the check, separated from the write: the bug
        delay = self._processing_delay()
        if delay:
            self.timer(delay, self._process, src, payload, early)
        else:
            self._process(src, payload, early)

    def _decide(self, token: FencingToken, scope: str) -> FenceDecision:
        high = self.live.high_water.get(scope, 0)
        return self.fence_rule(token, cluster=self.cluster, scope=scope, high_water=high)

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
        rule: FenceRule = self.fence_rule
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
        new_high = decision.new_high_water
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
        if self.restore_floor:
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


