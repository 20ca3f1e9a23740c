"""P11, the read/write lock in the simulator: the checker on hand-written logs, the lock's world on clean seeds,
and its controls caught (docs/simulation.md, "P11, the read/write lock").

The default run is a few seconds: the checker's cases, 12 clean seeds of the lock's world, and each control's
first catch (test_sim.py's every-mutant test runs them from seed 10,000 as well). ``STOCKADE_LONG=1`` runs
200 clean seeds and counts each control's catches over 200 seeds.
"""

from __future__ import annotations

import os

import pytest

from stockade.testing.mutants import MUTANTS, RWLOCK_SEAMS
from stockade.testing.rwlock_holds import check_rwlock
from stockade.testing.sim import SimOptions, World, run_campaign, run_seed

_MS = 1_000_000
LONG = os.environ.get("STOCKADE_LONG") == "1"
GATE = "rw.l"
CONTROLS = sorted(name for name, found in MUTANTS.items() if found.seam in RWLOCK_SEAMS)
# A control must be caught within this many seeds (first catches are 1-6 seeds; docs/simulation.md).
CONTROL_SEEDS_MAX = 60


class Log:
    """A history by hand: the coordinator's lease log (ms on one clock), the lock's records, check-ins."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def _coordinator(self, f: str, at_ms: int, scope: str, **value: object) -> Log:
        self.records.append({"t_ns": at_ms * _MS, "process": "coordinator", "type": "info", "f": f, "scope": scope,
                             "value": dict(value, clock=0, at_ns=at_ms * _MS)})
        return self

    def grant(self, lease: str, token: int, at_ms: int, scope: str = GATE, ttl_ms: int = 1000) -> Log:
        return self._coordinator("grant", at_ms, scope, lease=lease, token=token, expires_ns=(at_ms + ttl_ms) * _MS)

    def release(self, lease: str, at_ms: int, scope: str = GATE) -> Log:
        return self._coordinator("release", at_ms, scope, lease=lease)

    def hold(self, mode: str, token: int, lease: str, leases: list[str], at_ms: int, **extra: object) -> Log:
        value = dict(extra, client=token, mode=mode, token=token, lease=lease, leases=leases)
        self.records.append({"t_ns": at_ms * _MS, "process": "rwlock", "type": "info", "f": "hold", "scope": GATE,
                             "value": value})
        return self

    def answered(self, process: int, scope: str, token: int, at_ms: int) -> Log:
        """An acquire of ``process`` answered with ``token`` of ``scope`` (its invocation 1 ms before)."""
        self.records.append({"t_ns": (at_ms - 1) * _MS, "process": process, "type": "invoke", "f": "acquire",
                             "scope": scope})
        self.records.append({"t_ns": at_ms * _MS, "process": process, "type": "ok", "f": "acquire", "scope": scope,
                             "token": token})
        return self

    def check_in(self, process: int, key: str, token: int, at_ms: int, done_ms: int) -> Log:
        value = f"{process}-{at_ms}-t{token}"
        self.records.append({"t_ns": at_ms * _MS, "process": process, "type": "invoke", "f": "write", "scope": GATE,
                             "key": key, "token": token, "value": value, "idempotency_key": value})
        self.records.append({"t_ns": done_ms * _MS, "process": process, "type": "ok", "f": "write"})
        return self

    def validate(self, token: int, seen: int, at_ms: int) -> Log:
        verdict = "refused" if seen > token else "ok"
        self.records.append({"t_ns": (at_ms + 1) * _MS, "process": "rwlock", "type": "info", "f": "validate",
                             "scope": GATE, "value": {"client": token, "token": token, "seen": seen,
                                                      "verdict": verdict, "invoke_ns": at_ms * _MS}})
        return self


def _reader_then_writer(drained_at_ms: int) -> Log:
    """A reader (token 1) holds slot 0 from 10 until its release at 300; a writer (token 2) takes the gate at 100
    and drains slot 0 at ``drained_at_ms``."""
    log = Log().grant("G1", 1, 0).grant("S1", 1, 10, scope="sem.rw.l.0").release("G1", 20)
    log.hold("read", 1, "S1", ["G1", "S1"], 20).grant("G2", 2, 100)
    if drained_at_ms >= 300:
        log.release("S1", 300, scope="sem.rw.l.0")
    log.grant("D2", 2, drained_at_ms, scope="sem.rw.l.0").release("D2", drained_at_ms + 1, scope="sem.rw.l.0")
    return log.hold("write", 2, "G2", ["G2", "D2"], drained_at_ms + 5)


def test_p11_a_writer_beside_a_reader_is_flagged_and_one_that_drained_first_is_not():
    assert check_rwlock(_reader_then_writer(300).records, GATE) == []  # in after the reader left
    found = check_rwlock(_reader_then_writer(150).records, GATE)  # "drained" while the reader held: the control
    assert [v.property for v in found] == ["P11"], found
    assert "a writer (token 2) held the lock while a reader (token 1) did" in found[0].message
    # Without a drain at all, the writer holds from its gate's grant (100), beside the reader (10 .. 300).
    log = Log().grant("G1", 1, 0).grant("S1", 1, 10, scope="sem.rw.l.0").hold("read", 1, "S1", ["G1", "S1"], 20)
    assert len(check_rwlock(log.grant("G2", 2, 100).hold("write", 2, "G2", ["G2"], 105).records, GATE)) == 1
    # A reader whose slot lapsed (deadline 1010) before the writer's drain grant is not beside it.
    lapsed = Log().grant("G1", 1, 0).grant("S1", 1, 10, scope="sem.rw.l.0").hold("read", 1, "S1", ["G1", "S1"], 20)
    lapsed.grant("G2", 2, 100).grant("D2", 2, 1010, scope="sem.rw.l.0").hold("write", 2, "G2", ["G2", "D2"], 1015)
    assert check_rwlock(lapsed.records, GATE) == []


def test_p11_writer_tokens_rise_and_a_late_regrant_of_a_lease_id_is_not_the_hold():
    log = Log().grant("G5", 5, 0, ttl_ms=100).hold("write", 5, "G5", ["G5"], 5)
    log.grant("G4", 4, 200, ttl_ms=100).hold("write", 4, "G4", ["G4"], 205)
    found = check_rwlock(log.records, GATE)
    assert [v.message for v in found] == ["writer token 4 held the lock after writer token 5"], found
    # A late copy of the reader's slot acquire granted lease S1 again at 1500, after it had lapsed: the hold is
    # the grant the reader was answered with (10 .. 1010), not the orphan, so the writer at 1100 is clear.
    again = Log().grant("G1", 1, 0).grant("S1", 1, 10, scope="sem.rw.l.0").hold("read", 1, "S1", ["G1", "S1"], 20)
    again.grant("G2", 2, 1050).grant("D2", 2, 1100, scope="sem.rw.l.0").release("D2", 1101, scope="sem.rw.l.0")
    again.hold("write", 2, "G2", ["G2", "D2"], 1105).grant("S1", 3, 1500, scope="sem.rw.l.0")
    assert check_rwlock(again.records, GATE) == []
    # Seed 9205257: the orphan grant (token 3 at 1200) is logged before the reader's hold record (1300: it was
    # paused between its answers and its hold). Its hold is still the grant it was answered with (token 1).
    paused = Log().grant("G1", 1, 0).answered(1, GATE, 1, 2).grant("S1", 1, 10, scope="sem.rw.l.0")
    paused.answered(1, "sem.rw.l.0", 1, 12).release("G1", 20).grant("G2", 2, 1050)
    paused.answered(2, GATE, 2, 1052).grant("D2", 2, 1100, scope="sem.rw.l.0").release("D2", 1101, scope="sem.rw.l.0")
    paused.answered(2, "sem.rw.l.0", 2, 1102).hold("write", 2, "G2", ["G2", "D2"], 1105)
    paused.grant("S1", 3, 1200, scope="sem.rw.l.0").hold("read", 1, "S1", ["G1", "S1"], 1300)
    assert check_rwlock(paused.records, GATE) == []
    # The control, a checker that takes the last grant logged before the hold: the orphan, beside the writer.
    unanswered = [r for r in paused.records if r.get("f") != "acquire"]
    assert [v.property for v in check_rwlock(unanswered, GATE)] == ["P11"]


def test_p11_a_reader_validated_after_a_newer_writer_checked_in_is_flagged():
    log = Log().check_in(7, "rw.writer", 2, 100, 110)
    assert check_rwlock(Log().check_in(7, "rw.writer", 2, 100, 110).validate(1, 0, 105).records, GATE) == []
    found = check_rwlock(log.validate(1, 0, 120).records, GATE)  # invoked after the check-in's answer, saw 0
    assert [v.property for v in found] == ["P11"] and "after writer token 2 was in" in found[0].message
    assert check_rwlock(Log().check_in(7, "rw.writer", 2, 100, 110).validate(1, 2, 120).records, GATE) == []
    # A writer that returned without a check-in (the silent-writer control) is in from its return.
    silent = Log().grant("G2", 2, 0).hold("write", 2, "G2", ["G2"], 50, check_in="").validate(1, 0, 60)
    assert [v.property for v in check_rwlock(silent.records, GATE)] == ["P11"]
    # A check-in a restore rolled back (and listed) is no longer in.
    rolled = Log().check_in(7, "rw.writer", 2, 100, 110)
    rolled.records.append({"t_ns": 115 * _MS, "process": "nemesis", "type": "info", "f": "restore",
                           "value": {"rolled_back": ["7-100-t2"]}})
    assert check_rwlock(rolled.validate(1, 0, 120).records, GATE) == []


def test_p11_a_readers_check_in_accepted_after_a_newer_writers_is_flagged():
    log = Log().check_in(7, "rw.writer", 2, 100, 110).check_in(8, "rw.reader", 1, 120, 130)
    good = [(GATE, 2, "7-100-t2", 1), (GATE, 1, "8-120-t1", 2)]
    found = check_rwlock(log.records, GATE, audit=good)
    assert [v.message for v in found] == ["a reader's check-in (token 1) was accepted after writer token 2's"]
    assert check_rwlock(log.records, GATE, audit=list(reversed([(s, t, k, 3 - q) for s, t, k, q in good]))) == []


# --- the lock's world ------------------------------------------------------------------------------


def _lock_world(seed: int, mutant: str | None = None) -> World:
    world = World(seed, SimOptions.rwlock_world(seed), mutant=mutant)
    world.run()
    return world


def test_clean_seeds_of_the_lock_world_hold_p11_and_every_other_property():
    seeds = range(3000, 3100 if LONG else 3012)
    modes: dict[str, int] = {}
    for seed in seeds:
        world = _lock_world(seed)
        result = world.check()
        assert result.ok, f"seed {seed}: {result}"
        for record in world.history.records:
            if record.get("process") == "rwlock":
                value = record["value"]
                key = value.get("mode") or value.get("verdict")
                modes[key] = modes.get(key, 0) + 1
    # Not vacuous: both kinds of holds, and validations (a refused one too over the long run).
    assert modes.get("read", 0) > 10 and modes.get("write", 0) > 10 and modes.get("ok", 0) > 10, modes
    if LONG:
        assert modes.get("refused", 0) >= 1, modes


def test_run_seed_runs_both_worlds_without_a_control_and_each_control_in_its_own():
    clean = run_seed(3001)
    assert clean.ok and set(clean.steps_by_world) == {"plain", "rwlock"}
    assert clean.steps == sum(clean.steps_by_world.values())
    assert set(run_seed(3001, mutant="fencing-off").steps_by_world) == {"plain"}  # older controls: as before P11
    assert set(run_seed(3001, mutant=CONTROLS[0]).steps_by_world) == {"rwlock"}


@pytest.mark.parametrize("mutant", CONTROLS)
def test_each_control_of_the_lock_is_caught_by_p11_alone(mutant):
    campaign = run_campaign(range(1_000_000, 1_000_000 + CONTROL_SEEDS_MAX), mutant=mutant)
    assert campaign.failures, f"{mutant} survived {campaign.examples} seeds"
    failure = campaign.failures[0]
    assert failure.world == "rwlock" and {v.property for v in failure.violations} == {"P11"}, failure.violations


@pytest.mark.skipif(not LONG, reason="STOCKADE_LONG=1")
@pytest.mark.parametrize("mutant", CONTROLS)
def test_long_each_control_is_caught_in_many_seeds(mutant, capsys):
    campaign = run_campaign(range(1_000_000, 1_000_200), mutant=mutant, stop_at_first=False)
    with capsys.disabled():
        print(f"\n{mutant}: caught in {len(campaign.failures)} of {campaign.examples} seeds")
    assert len(campaign.failures) >= 20


# --- the controls' real-code twins (the registry's ``wrap``): they break a real lock the same way ---------


def test_the_lock_controls_wrap_a_real_read_write_lock(tmp_path):
    import stockade
    from stockade.core.errors import LockTimeout

    coord = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path}/store.db", cluster_id=coord.cluster_id)
    try:
        real = stockade.ReadWriteLock(coord, store, "catalog", readers=2)
        reader = real.acquire_read(ttl_ms=10_000)
        with pytest.raises(LockTimeout):  # the real writer waits for the reader's slot
            real.acquire_write(ttl_ms=10_000, wait_ms=50)
        broken = MUTANTS["rwlock-skip-drain"].wrap(stockade.ReadWriteLock(coord, store, "catalog", readers=2))
        lease = broken.acquire_write(ttl_ms=10_000, wait_ms=50)  # in beside the reader: the control
        assert real.readers_now() and store.get(real.scope, "rw.writer").token_value == lease.token.value
        lease.release()
        reader.release()
        silent = MUTANTS["rwlock-silent-writer"].wrap(stockade.ReadWriteLock(coord, store, "catalog", readers=2))
        stale = real.acquire_read(ttl_ms=10_000)
        stale.release()
        with silent.write(ttl_ms=10_000, wait_ms=1_000) as newer:  # no check-in: the mark stays the reader's
            assert store.get(real.scope, "rw.writer").token_value < newer.token.value
        stale.validate()  # the stale reader is not told: the control
        with real.write(ttl_ms=10_000, wait_ms=1_000):
            pass
        with pytest.raises(stockade.StaleToken):
            stale.validate()  # the real writer's check-in tells it
    finally:
        store.close()
        coord.close()
