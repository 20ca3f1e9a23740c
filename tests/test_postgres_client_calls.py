"""The client's work a lock cycle on the PostgreSQL coordinator, counted in function calls, against its budget.

A lock cycle through the client (`acquire` with ``keepalive=False``, then `release`) on the
embedded PostgreSQL coordinator is two calls of its server functions, each one ``PQexecPrepared``
(`stockade.coordinators.postgres._call`). The calls the caller's thread makes (Python and C,
``sys.setprofile``: the same count on every machine) are its client CPU in a figure that does not
move with the host's load; ``postgres.lock_cycle_client`` in `stockade.testing.budgets` holds it.

Control: the same cycle on the lease engine's path (the server functions off: each operation a
unit of two round trips, decided in Python) makes far more calls, over the budget.
"""

from __future__ import annotations

from helpers.work_budget import calls_of

import stockade
from stockade.testing.budgets import over_budget

CYCLES = 20
WARMUP = 5


def _calls_per_cycle(url: str, *, server_rules: bool = True) -> float:
    coord = stockade.connect(url)
    try:
        coord._port.engine.server_rules = server_rules

        def cycle() -> None:
            lease = coord.acquire("s", ttl_ms=60_000, keepalive=False)
            lease.release()

        for _ in range(WARMUP):
            cycle()
        return calls_of(cycle, CYCLES) / CYCLES
    finally:
        coord.close()


def test_a_lock_cycle_makes_the_calls_of_its_budget(pg_coord_url):
    calls = _calls_per_cycle(pg_coord_url)
    assert over_budget("postgres.lock_cycle_client", {"calls": calls}) == [], calls


def test_control_the_engines_path_is_over_the_budget(pg_coord_url):
    calls = _calls_per_cycle(pg_coord_url, server_rules=False)
    assert over_budget("postgres.lock_cycle_client", {"calls": calls}), calls
