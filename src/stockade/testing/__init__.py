"""stockade.testing: the proof kit, public like trio.testing.

- `clock`: simulated time (`SimTime`), per-process clocks with drift and jumps
  (`SimClock`), and a hand-driven clock (`ManualClock`).
- `network`: a simulated network that drops, delays, duplicates, reorders and
  partitions messages (`SimNetwork`, `NetworkOptions`).
- `sim`: the deterministic simulator. It drives the real sans-IO core and the
  documented client protocol, and every knob is drawn from one seed
  (`run_seed`, `run_campaign`, `replay_command`; the ``stockade sim`` command).
- `history`: Jepsen-style histories in their JSON-lines form (docs/simulation.md).
- `checkers`: P1–P7 and P9 over a history and the resource's audit trail (`check`).
- `linearizability`: a fenced-register linearizability check, per scope.
- `faults`: fault-injecting wrappers over the ports (`FaultyRecords` fails a
  record store's units before or after their commit), for every backend.
- `fences`: the harnesses of the project's own fence adapters and their conformance descriptors
  (`fences.targets`, named by the resource registry's ``FENCE_TARGETS``).
- `servers`: throwaway PostgreSQL and Redis servers on free loopback ports, in temporary directories,
  for an adapter's conformance run (and the watcher that ends them if the test process is killed).
- `mutants`: deliberately broken fenced stores. Every fault test runs once
  against one of them and must fail there, because a test that cannot fail
  proves nothing.

Nothing else in the package imports `stockade.testing` (the ``stockade sim``
command loads it only when it runs). `stockade.testing` may import anything.
"""

from stockade.testing.checkers import CheckResult, Violation, check
from stockade.testing.clock import ManualClock, SimClock, SimTime
from stockade.testing.history import AuditEntry, History, Op, dump_jsonl, load_jsonl, pair
from stockade.testing.linearizability import LinearizabilityResult, check_linearizable
from stockade.testing.mutants import CheckThenWriteStore, FencingOffStore, StrictGreaterStore
from stockade.testing.network import NetworkOptions, SimNetwork
from stockade.testing.sim import Campaign, RunResult, SimOptions, World, narrate, replay_command, run_campaign, run_seed

__all__ = [
    "SimTime",
    "SimClock",
    "ManualClock",
    "SimNetwork",
    "NetworkOptions",
    "World",
    "SimOptions",
    "RunResult",
    "Campaign",
    "run_seed",
    "run_campaign",
    "narrate",
    "replay_command",
    "History",
    "Op",
    "AuditEntry",
    "pair",
    "dump_jsonl",
    "load_jsonl",
    "check",
    "CheckResult",
    "Violation",
    "check_linearizable",
    "LinearizabilityResult",
    "FencingOffStore",
    "StrictGreaterStore",
    "CheckThenWriteStore",
]
