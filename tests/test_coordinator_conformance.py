"""The coordinator conformance suite (`stockade.testing.conformance.coordinator`), on every registered backend.

Every test runs on each parameter of `BACKENDS` (tests/conftest.py: a new backend adds one line there, and
`tests/test_public_api.py::test_every_registered_coordinator_runs_the_conformance_suite`
fails until it does); PostgreSQL runs once more on each database of conftest's `PG_VARIANTS`, the cases of
`VARIANT_CASES` there.

A case that takes ``client`` runs, on each backend, in one mode by default (`modes_of`): sync and async
alternate by case and by backend, so that every case runs in both modes across the backends and every backend
runs about half of its cases in each. ``STOCKADE_LONG=1`` runs every case in both modes on every backend. The
two modes are one source: the ``_sync`` code is generated from the ``_async`` code (scripts/unasync.py), and
tests/test_unasync.py fails when they differ.
"""

import importlib
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
from conftest import BACKENDS, PG_VARIANTS, runner_of

from stockade.testing.conformance.coordinator import *  # noqa: F403 - the suite's tests
from stockade.testing.conformance.journal import *  # noqa: F403 - the lease-journal suite's tests

#: The cases that run on a SQL_ASCII database too (``postgres-sql_ascii``). What the encoding changes is how
#: the port's text comes back (psycopg hands it back as bytes there, unless the connection asks for UTF8): these
#: read each kind of it at least once, over a first and a later connection: the cluster id and the keyring (a
#: store's check), lease ids (acquire, renew, release, a release by another handle), holders and scope names
#: (inspect, scopes), the journal's kinds, and a waiter woken by a release. The other cases are about time and
#: order (keepalive, lock-delay, FIFO across caps, cancels) or the client alone, the same on either encoding;
#: they run on the UTF8 database (``postgres``).
SQL_ASCII_CASES = frozenset({
    "test_acquire_release_tokens_increase",
    "test_stale_token_rejected_after_newer_grant",
    "test_wait_times_out_then_fifo_grant",
    "test_lease_lost_when_coordinator_refuses_renewal",
    "test_waiter_is_granted_when_holder_releases",
    "test_inspect_and_scopes_while_held",
    "test_renew_after_release_is_lease_lost",
    "test_token_of_another_scope_is_mismatch",
    "test_last_issued_is_the_fence_floor",
    "test_history_names_each_grant_and_release_in_order",
    "test_history_tells_an_expiry_from_a_release",
})
#: The cases that run on a database whose default isolation is stricter than READ COMMITTED
#: (``postgres-repeatable_read``, ``postgres-serializable``). The level changes what a unit reads only when
#: another unit commits between its snapshot and its lock, so only where two of the coordinator's sessions run
#: units at once: one session alone begins each unit after the last one committed, and reads what READ
#: COMMITTED reads. These run units at once: handles opened at once on a fresh database and contending for a
#: scope; waiters woken by a release, timed out, cancelled, or in line across wait caps beside the holder. The
#: whole suite on both variants took ~40 s of the test processes' CPU (58 cases, 46 s at -n 2), and with the
#: sessions' READ COMMITTED removed only the contention case failed there (2 of 58).
CONCURRENT_CASES = frozenset({
    "test_handles_opened_at_once_contending_for_a_scope_all_answer",
    "test_waiter_is_granted_when_holder_releases",
    "test_c4_waiters_are_served_in_arrival_order",
    "test_wait_times_out_then_fifo_grant",
    "test_c4_a_wait_until_granted_keeps_its_place_across_caps",
    "test_cancelling_a_wait_until_granted_leaves_no_waiter",
    "test_contenders_holder_first_then_waiters_in_arrival_order",
})
#: The cases each PostgreSQL variant (conftest's `PG_VARIANTS`) runs; a registered backend runs every case.
VARIANT_CASES: dict[str, frozenset[str]] = {
    "postgres-sql_ascii": SQL_ASCII_CASES,
    "postgres-repeatable_read": CONCURRENT_CASES,
    "postgres-serializable": CONCURRENT_CASES,
}
#: The parameters in the order the modes alternate by (`modes_of`): the registered backends, then the variants.
ALL_BACKENDS = [*BACKENDS, *VARIANT_CASES]


def runs_on(case: str, backend: str) -> bool:
    """Whether ``case`` runs on ``backend``: every case on a registered backend, a variant's own on a variant."""
    return backend not in VARIANT_CASES or case in VARIANT_CASES[backend]


#: The client's two modes, in the order the test ids name them.
MODES = ("sync", "async")
#: ``STOCKADE_LONG=1``: every case in both modes on every backend.
BOTH_MODES = os.environ.get("STOCKADE_LONG") == "1"


def cases_of(backend: str, module: object) -> list[str]:
    """The cases that take ``client`` and run on ``backend``, by name: the order the modes alternate in."""
    cases = sorted(name for name, case in vars(module).items()
                   if name.startswith("test_") and callable(case) and "client" in inspect.signature(case).parameters)
    return [case for case in cases if runs_on(case, backend)]


def modes_of(case: str, backend: str, module: object, both: bool = BOTH_MODES) -> tuple[str, ...]:
    """The modes ``case`` runs in on ``backend``: both with ``both``, else one, by the case's place among the
    backend's cases plus the backend's place, so that neighbouring cases and neighbouring backends alternate.
    Deterministic: names and the parameters' order, nothing random."""
    if both:
        return MODES
    place = cases_of(backend, module).index(case) + ALL_BACKENDS.index(backend)
    return (MODES[place % 2],)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        case = metafunc.function.__name__
        backends = [backend for backend in ALL_BACKENDS if runs_on(case, backend)]
        if "client" not in metafunc.fixturenames:
            metafunc.parametrize("backend", backends, indirect=True)
            return
        pairs = [(mode, backend) for mode in MODES for backend in backends
                 if mode in modes_of(case, backend, metafunc.module)]
        # The ids read as before: [sync-postgres].
        metafunc.parametrize(("client", "backend"), pairs, indirect=True, ids=[f"{m}-{b}" for m, b in pairs])


@pytest.fixture
def client(request: pytest.FixtureRequest):
    """The conftest's ``client``, parametrized here (`pytest_generate_tests`) before ``backend``."""
    with runner_of(request.param) as runner:
        yield runner


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The conftest's ``backend``; the variants of `VARIANT_CASES` too, for their cases."""
    return str(request.param)


def test_every_variant_runs_and_every_variant_case_is_in_the_suite() -> None:
    """A variant conftest makes but `VARIANT_CASES` does not name would never run, and a case renamed in the
    suite would drop out of a variant's run, each without a word."""
    assert set(VARIANT_CASES) == set(PG_VARIANTS)
    for cases in VARIANT_CASES.values():
        assert cases <= set(globals()), sorted(cases - set(globals()))


def missing_cases(gathered: set[str], parts: list[types.ModuleType]) -> list[str]:
    """The tests of ``parts`` that ``gathered`` (the suite's ``__all__``) lacks, as ``module.name``."""
    return sorted(f"{part.__name__}.{name}" for part in parts for name in vars(part)
                  if name.startswith("test_") and name not in gathered)


def test_every_part_of_the_suite_is_gathered_and_run() -> None:
    """The suite is written in parts, the ``coordinator_*`` modules beside it, and gathered by
    `stockade.testing.conformance.coordinator`: a case of a part it does not gather would never run, here or in
    a user's run. The control: a part it has not gathered is found."""
    from stockade.testing.conformance import coordinator as suite

    names = sorted(path.stem for path in Path(suite.__file__).parent.glob("coordinator_*.py"))
    parts = [importlib.import_module(f"stockade.testing.conformance.{name}") for name in names]
    assert len(parts) >= 4, names
    assert missing_cases(set(suite.__all__), parts) == []
    assert set(suite.__all__) <= set(globals())
    new_part = types.ModuleType("coordinator_new")
    vars(new_part)["test_a_new_case"] = lambda client, coord_url: None
    assert missing_cases(set(suite.__all__), [*parts, new_part]) == ["coordinator_new.test_a_new_case"]


def _split(choose) -> tuple[dict[str, dict[str, int]], set[str]]:
    """Under ``choose(case, backend) -> modes``: each backend's count of cases per mode, and the cases that run
    in one mode only across all backends."""
    module = sys.modules[__name__]
    counts: dict[str, dict[str, int]] = {}
    seen: dict[str, set[str]] = {}
    for backend in ALL_BACKENDS:
        counts[backend] = dict.fromkeys(MODES, 0)
        for case in cases_of(backend, module):
            for mode in choose(case, backend):
                counts[backend][mode] += 1
                seen.setdefault(case, set()).add(mode)
    return counts, {case for case, modes in seen.items() if len(modes) < 2}


def test_the_default_run_takes_both_modes_on_every_backend_and_for_every_case() -> None:
    """Each backend runs at least 40 % of its cases in each mode, and each case runs in both modes across the
    backends. The control: choosing the mode by the case alone leaves every case in one mode."""
    counts, one_mode_only = _split(lambda case, backend: modes_of(case, backend, sys.modules[__name__], both=False))
    print("cases per mode on each backend (sync, async):", {b: tuple(c.values()) for b, c in counts.items()})
    for backend, by_mode in counts.items():
        assert min(by_mode.values()) >= 0.4 * sum(by_mode.values()), (backend, by_mode)
    assert not one_mode_only
    assert _split(lambda case, backend: modes_of(case, "embedded", sys.modules[__name__], both=False))[1]
    both, _ = _split(lambda case, backend: modes_of(case, backend, sys.modules[__name__], both=True))
    assert all(by_mode["sync"] == by_mode["async"] > 0 for by_mode in both.values())


def test_the_c5_tests_catch_an_etcd_port_without_lock_delay(etcd_cluster, tmp_path):
    """The control: the suite's two C5 tests, on a real etcd, with the port's lock-delay decision dropped
    (`stockade.testing.mutants` ``etcd-lock-delay-off``): each fails, granted before the delay had passed."""
    from conftest import ClientDelayed, SyncRunner

    from stockade.testing.conformance import coordinator as suite
    from stockade.testing.mutants import MUTANTS

    broken = MUTANTS["etcd-lock-delay-off"]

    handles = []  # closed after each failure: the failed test left its lease, and its keepalive, running

    class WithoutLockDelay(ClientDelayed):
        def connect(self, client):
            handle = super().connect(client)
            broken.wrap(handle._port)
            handles.append(handle)
            return handle

    caught = []
    for test in (suite.test_c5_lock_delay_after_a_lapse_not_after_a_release,
                 suite.test_c5_a_pending_lock_delay_outlives_a_restart):
        url = f"{etcd_cluster.url}/{tmp_path.name}-{len(caught)}"
        try:
            with pytest.raises(AssertionError, match="before the lock-delay had passed") as failed:
                test(SyncRunner(), lambda lock_delay_ms, restart=False, url=url: WithoutLockDelay(url, lock_delay_ms,
                                                                                                  None))
        finally:
            while handles:
                handles.pop().close()
        caught.append(f"{test.__name__}: {str(failed.value).splitlines()[0]}")
    print(f"etcd-lock-delay-off caught by {len(caught)} of 2 C5 tests:", *caught, sep="\n  ")
