"""The coordinator conformance suite (`stockade.testing.conformance.coordinator`), on every registered backend.

The ``backend`` fixture here takes each parameter of `CONFORMANCE_BACKENDS` (tests/conftest.py):
every one of `BACKENDS` (a new backend adds one line there, and
`tests/test_public_api.py::test_every_registered_coordinator_runs_the_conformance_suite`
fails until it does), and PostgreSQL once more on a SQL_ASCII database.
"""

import pytest
from conftest import CONFORMANCE_BACKENDS

from stockade.testing.conformance.coordinator import *  # noqa: F403 - the suite's tests
from stockade.testing.conformance.history import *  # noqa: F403 - the history suite's tests


@pytest.fixture(params=CONFORMANCE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The conftest's ``backend``, with ``postgres-sql_ascii`` added (the suite only)."""
    return str(request.param)
