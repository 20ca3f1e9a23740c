"""The coordinator conformance suite (`stockade.testing.conformance.coordinator`), on every registered backend.

The ``backend`` fixture (tests/conftest.py) takes each parameter of `BACKENDS`;
a new backend adds one line there, and
`tests/test_public_api.py::test_every_registered_coordinator_runs_the_conformance_suite`
fails until it does.
"""

from stockade.testing.conformance.coordinator import *  # noqa: F403 - the suite's tests
from stockade.testing.conformance.history import *  # noqa: F403 - the history suite's tests
