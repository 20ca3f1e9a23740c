"""The coordinator conformance suite: what every coordinator backend must do, through the client.

Every test runs through the public Python API, sync and async from one source,
so it checks the coordinator port (acquire with waiting, renew, release,
inspect, scopes, last issued), the rules C1-C5 as a user meets them, and the
client's lease objects and keepalive on top.

Run it by importing its tests into a test module (``from
stockade.testing.conformance.coordinator import *``) and providing five
fixtures:

- ``client``: a runner with ``mode`` (``"sync"`` or ``"async"``),
  ``connect(url, **options)`` and ``open_store(url)`` (the client's own
  functions), ``run(x)``, which awaits ``x`` in async mode and returns it in
  sync mode, and in async mode ``loop``, the event loop ``run`` drives;
- ``coord_url``: a url of the backend under test, fresh for each test;
- ``store_url``: a fenced store that trusts that backend's tokens;
- ``delayed_backend``: ``delayed_backend(lock_delay_ms, restart=False)`` opens
  the backend under test with that lock-delay (C5), as a `DelayedBackend`;
  with ``restart``, one whose restart is slow (a new server process) may take
  a longer delay, so that the restart lands while the delay is pending;
- ``capped_wait``: the backend as a wait until granted meets it (`CappedWait`):
  its url with a small per-request wait cap where it has one.

C4 and C5 are judged by order and by lower bounds on time, which a busy host
cannot break: a grant after a lapse must come at least the lock-delay after
the last look that still saw the lapsed lease held; a grant after a release,
before the lock-delay (a second) could have passed.

The project's own run (tests/test_coordinator_conformance.py, fixtures in
tests/conftest.py) takes every scheme of
`stockade.coordinators.registry.COORDINATORS`: the SQLite file, the in-memory
engine, and a real `stockade serve` subprocess over HTTP. It runs each case on
each backend in one mode by default, sync and async alternating by case and by
backend, and in both modes with ``STOCKADE_LONG=1``: the sync client is
generated from the async source, and the run checks that they are equal.

The suite is written in parts, one module each, by the rules they check; this
module gathers their tests (its ``__all__``) and the names a runner of the
suite reaches for:

- `stockade.testing.conformance.coordinator_grants`: grants and their tokens
  (C1, C2), and the tokens at a fenced store (K1, R1-R3);
- `stockade.testing.conformance.coordinator_waits`: waiting (C4): deadlines,
  arrival order, waits until granted across caps and cancelled;
- `stockade.testing.conformance.coordinator_expiry`: how a lease ends:
  keepalive and loss (K2), the lock-delay after a lapse and across a restart
  (C3, C5);
- `stockade.testing.conformance.coordinator_inspect`: reads of the state:
  inspect, scopes, last issued, contenders;
- `stockade.testing.conformance.coordinator_helpers`: what the parts share
  (a call in either client mode, beside the test, bounded waits, a SIGINT).

A new case goes in the part of its rule, whose ``__all__`` names every test
of it; tests/test_coordinator_conformance.py fails when a case of a
``coordinator_*`` module (a new part too) is not gathered here.
"""

from __future__ import annotations

from stockade.testing.conformance.coordinator_expiry import *  # noqa: F403 - the part's tests
from stockade.testing.conformance.coordinator_expiry import LAPSE_TTL_MS as LAPSE_TTL_MS
from stockade.testing.conformance.coordinator_expiry import LOCK_DELAY_MS as LOCK_DELAY_MS
from stockade.testing.conformance.coordinator_expiry import RESTART_LOCK_DELAY_MS as RESTART_LOCK_DELAY_MS
from stockade.testing.conformance.coordinator_expiry import DelayedBackend as DelayedBackend
from stockade.testing.conformance.coordinator_grants import *  # noqa: F403 - the part's tests
from stockade.testing.conformance.coordinator_grants import CONTENDED_CYCLES as CONTENDED_CYCLES
from stockade.testing.conformance.coordinator_grants import CONTENDING_HANDLES as CONTENDING_HANDLES
from stockade.testing.conformance.coordinator_helpers import SIGINT_GRACE_S as SIGINT_GRACE_S
from stockade.testing.conformance.coordinator_helpers import SIGINT_SENDS as SIGINT_SENDS
from stockade.testing.conformance.coordinator_helpers import _acquiring as _acquiring
from stockade.testing.conformance.coordinator_helpers import _await_waiters as _await_waiters
from stockade.testing.conformance.coordinator_helpers import _close as _close
from stockade.testing.conformance.coordinator_helpers import _in_background as _in_background
from stockade.testing.conformance.coordinator_helpers import _interrupted_when_queued as _interrupted_when_queued
from stockade.testing.conformance.coordinator_inspect import *  # noqa: F403 - the part's tests
from stockade.testing.conformance.coordinator_inspect import CONTENDER_NAMES as CONTENDER_NAMES
from stockade.testing.conformance.coordinator_inspect import check_contenders as check_contenders
from stockade.testing.conformance.coordinator_waits import *  # noqa: F403 - the part's tests
from stockade.testing.conformance.coordinator_waits import FIFO_WAITERS as FIFO_WAITERS
from stockade.testing.conformance.coordinator_waits import FOREVER_CANCELS as FOREVER_CANCELS
from stockade.testing.conformance.coordinator_waits import FOREVER_CAPS as FOREVER_CAPS
from stockade.testing.conformance.coordinator_waits import FOREVER_GONE_S as FOREVER_GONE_S
from stockade.testing.conformance.coordinator_waits import CappedWait as CappedWait

__all__ = [name for name in dir() if name.startswith("test_")]
