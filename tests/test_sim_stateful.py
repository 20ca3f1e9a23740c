"""A hypothesis state machine over the simulator's model: every step is an explicit choice.

Where the seeded simulator draws the schedule from a seed, here hypothesis
picks each step — acquire, renew, release, write with the held or a stale
token, read, advance the clock, deliver/drop/duplicate one message, crash and
restart the coordinator or the resource, back up and restore, pause a process,
jump a clock — runs the P1–P7 checkers and the linearizability check on the
history, and shrinks a failure to a short sequence of steps.

The same machine against a mutant must fail: that is the control.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from stockade.testing.linearizability import check_linearizable
from stockade.testing.sim import SimOptions, World

_MS = 1_000_000
TTL_MS = 200
OPTIONS = SimOptions(clients=3, scopes=2, keys=2, ttl_ms=TTL_MS, write_retries=1)

CLIENTS = st.integers(0, OPTIONS.clients - 1)
SCOPES = st.sampled_from([f"s{i}" for i in range(OPTIONS.scopes)])
KEYS = st.sampled_from([f"k{i}" for i in range(OPTIONS.keys)])
NODES = st.sampled_from(["coordinator", "resource", "c0", "c1", "c2"])


def machine_for(mutant: str | None) -> type[RuleBasedStateMachine]:
    class ProtocolMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.world = World(0, OPTIONS, mutant=mutant, manual_network=True, autopilot=False)

        def idle(self, i: int):
            client = self.world.clients[i]
            return client if client.op is None else None

        def settle(self, now: bool) -> None:
            """``now``: the network behaves for this request — deliver everything pending, in order."""
            for _ in range(20 if now else 0):
                if not self.world.network.pending:
                    break
                self.world.deliver(0)

        # -- client operations -----------------------------------------------------------------

        @rule(i=CLIENTS, scope=SCOPES, now=st.booleans())
        def acquire(self, i, scope, now):
            if (client := self.idle(i)) is not None:
                client.begin_acquire(scope, 0)
                self.settle(now)

        @rule(i=CLIENTS, now=st.booleans())
        def renew(self, i, now):
            if (client := self.idle(i)) is not None:
                client.begin_renew()
                self.settle(now)

        @rule(i=CLIENTS, now=st.booleans())
        def release(self, i, now):
            if (client := self.idle(i)) is not None:
                client.begin_release()
                self.settle(now)

        @rule(i=CLIENTS, key=KEYS, stale=st.booleans(), now=st.booleans())
        def write(self, i, key, stale, now):
            if (client := self.idle(i)) is not None:
                client.begin_write(key, stale=stale)
                self.settle(now)

        @rule(i=CLIENTS, scope=SCOPES, key=KEYS, now=st.booleans())
        def read(self, i, scope, key, now):
            if (client := self.idle(i)) is not None:
                client.begin_read(scope, key)
                self.settle(now)

        # -- time and the network --------------------------------------------------------------

        @rule(ms=st.integers(1, 3 * TTL_MS), now=st.booleans())
        def advance(self, ms, now):
            """Let time pass; ``now``: the network delivers every message as soon as it is sent."""
            world = self.world
            target = world.time.now_ns + ms * _MS
            while True:
                self.settle(now)
                due = world.next_due_ns()
                if due is None or due > target:
                    break
                world.step()
            world.run_until(target)
            self.settle(now)

        @precondition(lambda self: self.world.network.pending)
        @rule(action=st.sampled_from(["deliver", "drop", "duplicate"]), index=st.integers(0, 50))
        def network(self, action, index):
            if action == "deliver":
                self.world.deliver(index)
            elif action == "drop":
                self.world.network.drop(index)
            else:
                self.world.network.duplicate(index)

        @rule()
        def deliver_all(self):
            self.settle(True)

        # -- faults (one rule, so that faults do not crowd out the client's steps) --------------

        @rule(fault=st.sampled_from(["crash-coordinator", "restart-coordinator", "crash-resource",
                                     "restart-resource", "backup", "restore"]))
        def fault(self, fault):
            world = self.world
            {
                "crash-coordinator": world._do_crash_coordinator,
                "restart-coordinator": world._restart_coordinator,
                "crash-resource": world._do_crash_resource,
                "restart-resource": world._restart_resource,
                "backup": world._do_backup,
                "restore": world._do_restore,
            }[fault]()

        @rule(node=NODES, pause=st.booleans(), ms=st.integers(1, 5 * TTL_MS))
        def pause_or_jump(self, node, pause, ms):
            if pause:
                self.world.pause(self.world.nodes[node], ms * _MS, reason="hypothesis")
            else:
                self.world.nodes[node].clock.jump(min(ms, 2 * TTL_MS) * _MS)

        # -- the properties --------------------------------------------------------------------

        def teardown(self):
            # Checked once per example, on the whole history: the properties are about histories,
            # and a violation stays in the history once it happened, so nothing is missed.
            world = getattr(self, "world", None)
            if world is None:
                return
            result = world.check()
            assert result.ok, str(result)
            lin = check_linearizable(world.history.records, steps_max=100_000)
            assert lin.ok, "\n".join(str(v) for v in lin.violations)

    return ProtocolMachine


ProtocolMachine = machine_for(None)
TestProtocol = ProtocolMachine.TestCase
TestProtocol.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])


def _hunt(mutant: str, examples: int) -> str:
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(
            machine_for(mutant),
            settings=settings(max_examples=examples, stateful_step_count=40, deadline=None, derandomize=True,
                              database=None, suppress_health_check=[HealthCheck.too_slow], print_blob=False),
        )
    return str(caught.value)


def test_the_machine_catches_a_mutant_and_shrinks_it():
    message = _hunt("strict-greater", 1_000)
    assert "P8" in message or "linearizability" in message


@pytest.mark.long
@pytest.mark.skipif(not os.environ.get("STOCKADE_LONG"), reason="long run: STOCKADE_LONG=1")
def test_the_machine_catches_fencing_off():
    message = _hunt("fencing-off", 5_000)
    assert "P2" in message or "linearizability" in message
