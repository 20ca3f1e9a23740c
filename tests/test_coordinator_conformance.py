"""The coordinator conformance suite (`stockade.testing.conformance.coordinator`), on every registered backend.

The ``backend`` fixture here takes each parameter of `CONFORMANCE_BACKENDS` (tests/conftest.py):
every one of `BACKENDS` (a new backend adds one line there, and
`tests/test_public_api.py::test_every_registered_coordinator_runs_the_conformance_suite`
fails until it does), and PostgreSQL once more on a SQL_ASCII database.
"""

import pytest
from conftest import CONFORMANCE_BACKENDS

from stockade.testing.conformance.coordinator import *  # noqa: F403 - the suite's tests
from stockade.testing.conformance.journal import *  # noqa: F403 - the lease-journal suite's tests


@pytest.fixture(params=CONFORMANCE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The conftest's ``backend``, with ``postgres-sql_ascii`` added (the suite only)."""
    return str(request.param)


def test_the_c5_tests_catch_an_etcd_port_without_lock_delay(etcd_cluster, tmp_path):
    """The control: the suite's two C5 tests, on a real etcd, with the port's lock-delay decision dropped
    (`stockade.testing.mutants` ``etcd-lock-delay-off``): each fails, granted before the delay had passed."""
    from conftest import ClientDelayed, SyncRunner

    from stockade.testing.conformance import coordinator as suite
    from stockade.testing.mutants import MUTANTS

    broken = MUTANTS["etcd-lock-delay-off"]

    class WithoutLockDelay(ClientDelayed):
        def connect(self, client):
            handle = super().connect(client)
            broken.wrap(handle._port)
            return handle

    caught = []
    for test in (suite.test_c5_lock_delay_after_a_lapse_not_after_a_release,
                 suite.test_c5_a_pending_lock_delay_outlives_a_restart):
        url = f"{etcd_cluster.url}/{tmp_path.name}-{len(caught)}"
        with pytest.raises(AssertionError, match="before the lock-delay had passed") as failed:
            test(SyncRunner(), lambda lock_delay_ms, restart=False, url=url: WithoutLockDelay(url, lock_delay_ms, None))
        caught.append(f"{test.__name__}: {str(failed.value).splitlines()[0]}")
    print(f"etcd-lock-delay-off caught by {len(caught)} of 2 C5 tests:", *caught, sep="\n  ")
