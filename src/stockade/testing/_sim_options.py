"""The knobs of one simulated run, and how a seed draws them (swarm testing)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from stockade.core.limits import RELEASE_LAG_MS
from stockade.testing.network import NetworkOptions

__all__ = ["SimOptions"]

_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Every knob of one simulated run. `SimOptions.swarm(rng)` draws them from a seed."""

    clients: int = 3
    scopes: int = 1
    keys: int = 2
    duration_ms: int = 5_000
    ttl_ms: int = 500
    lock_delay_ms: int = 0
    drift_margin_percent: int = 10
    think_max_ms: int = 20
    poll_ms: int = 20
    writes_per_lease_max: int = 8
    write_retries: int = 2
    read_probability: float = 0.2
    misuse_probability: float = 0.0
    stale_write_probability: float = 0.0
    zombie_pause_probability: float = 0.0
    network: NetworkOptions = field(default_factory=NetworkOptions)
    partition_per_s: float = 0.0
    coordinator_crash_per_s: float = 0.0
    resource_crash_per_s: float = 0.0
    restore_per_s: float = 0.0
    backup_per_s: float = 0.0
    pause_per_s: float = 0.0
    clock_jump_per_s: float = 0.0
    drift_ppm_max: int = 0
    processing_max_us: int = 0
    commit_max_us: int = 0
    checkpoint_ms: int = 200
    #: How long a release answered before its commit waits at most for a commit to ride with, as `stockade serve`
    #: does (``--release-lag-ms``): a crash within it loses the release (C3). Not drawn: every world has the
    #: server's default (a draw would move every later draw of a seed).
    release_lag_ms: int = RELEASE_LAG_MS
    #: Above 0: the world is one read/write lock of this many read slots, its clients readers and writers
    #: (`stockade.testing._sim_rwlock`, P11); 0: the plain world, clients of plain leases.
    rwlock_readers: int = 0
    #: In the lock's world, the share of acquisitions that are writes (percent).
    rwlock_write_percent: int = 0
    #: In the lock's world, the share of read holds paused (1–5 TTL) between their reads and their validation.
    rwlock_pause_percent: int = 0

    @classmethod
    def swarm(cls, rng: random.Random) -> SimOptions:
        """Draw a configuration: each fault on or off, and how hard, from ``rng``."""

        def maybe(value: Any, off: Any = 0) -> Any:
            return value if rng.random() < 0.5 else off

        ttl_ms = rng.choice([200, 500, 1000])
        network = NetworkOptions(
            drop_probability=maybe(rng.choice([0.01, 0.05, 0.2]), 0.0),
            duplicate_probability=maybe(rng.choice([0.02, 0.1, 0.3]), 0.0),
            delay_min_ns=rng.choice([50_000, 500_000]),
            delay_max_ns=rng.choice([1, 5, 30, 150]) * _MS,
            slow_probability=maybe(rng.choice([0.01, 0.05]), 0.0),
            slow_delay_max_ns=rng.choice([2, 4]) * ttl_ms * _MS,
        )
        return cls(
            clients=rng.randint(1, 5),
            scopes=rng.randint(1, 3),
            keys=rng.randint(1, 3),
            duration_ms=rng.choice([2_000, 4_000, 8_000]),
            ttl_ms=ttl_ms,
            lock_delay_ms=maybe(ttl_ms // 2),
            drift_margin_percent=rng.choice([5, 10, 20]),
            think_max_ms=rng.choice([1, 10, 50]),
            poll_ms=rng.choice([5, 25]),
            writes_per_lease_max=rng.choice([1, 4, 16]),
            write_retries=rng.choice([0, 1, 3]),
            read_probability=rng.choice([0.0, 0.2, 0.5]),
            misuse_probability=maybe(0.02, 0.0),
            stale_write_probability=maybe(rng.choice([0.02, 0.1]), 0.0),
            zombie_pause_probability=maybe(rng.choice([0.01, 0.05, 0.2]), 0.0),
            network=network,
            partition_per_s=maybe(rng.choice([0.2, 1.0]), 0.0),
            coordinator_crash_per_s=maybe(rng.choice([0.2, 1.0]), 0.0),
            resource_crash_per_s=maybe(rng.choice([0.2, 1.0]), 0.0),
            restore_per_s=maybe(rng.choice([0.2, 0.5]), 0.0),
            backup_per_s=rng.choice([0.5, 2.0]),
            pause_per_s=maybe(rng.choice([0.2, 1.0]), 0.0),
            clock_jump_per_s=maybe(rng.choice([0.2, 1.0]), 0.0),
            drift_ppm_max=maybe(rng.choice([200, 5_000, 50_000])),
            processing_max_us=maybe(rng.choice([200, 2_000, 20_000])),
            commit_max_us=maybe(rng.choice([500, 5_000])),
            checkpoint_ms=rng.choice([50, 200, 1000]),
        )

    @classmethod
    def rwlock_world(cls, seed: int) -> SimOptions:
        """The options of seed ``seed``'s world of the read/write lock: the plain world's faults, drawn from
        the same seed, with 2–5 clients of one lock of 1–3 read slots (drawn from a stream of their own), for
        at most 4 s of simulated time (each of its steps costs more: most are the coordinator's).

        The clocks stay within the drift margin, as K2 assumes (two clocks drift apart by at most half the
        margin over a TTL); the world also leaves the coordinator's clock unjumped (`World`).
        """
        base = cls.swarm(random.Random(seed))
        rng = random.Random(f"{seed}/rwlock")
        cap_ppm = base.drift_margin_percent * 2_500
        return replace(base, clients=rng.randint(2, 5), scopes=1, rwlock_readers=rng.randint(1, 3),
                       duration_ms=min(base.duration_ms, 4_000),
                       rwlock_write_percent=rng.choice([20, 50]), rwlock_pause_percent=rng.choice([20, 50]),
                       drift_ppm_max=min(base.drift_ppm_max, cap_ppm))

    def describe(self) -> str:
        """The knobs that are on, in one line."""
        on = []
        defaults = SimOptions()
        for name, value in asdict(self).items():
            if name == "network":
                continue
            if value != getattr(defaults, name) or name in ("clients", "scopes", "ttl_ms"):
                on.append(f"{name}={value}")
        n = self.network
        on.append(f"drop={n.drop_probability} dup={n.duplicate_probability} delay<={n.delay_max_ns // 1000}us "
                  f"slow={n.slow_probability}")
        return " ".join(on)
