"""The port to a lease engine that wakes its own waiters (the PostgreSQL coordinator).

Like `AsyncEmbeddedCoordinatorPort`, but a queued attempt does not poll: it
sleeps until the engine reports that the scope changed (a LISTEN/NOTIFY in
PostgreSQL), or until the time the engine said to look again (the holder's
deadline, the end of a lock-delay), whichever is first. The wait deadline is
on the engine's clock, the server's (C3); the client's own clock only
measures its lease deadline (K2) and bounds how long it keeps trying.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from stockade.client._async._embedded import AsyncEmbeddedCoordinatorPort
from stockade.client._shared import Grant
from stockade.clock import SystemClock
from stockade.coordinators._mint import new_lease_id
from stockade.coordinators.registry import REMOTE_OPTIONS, Capability, PortOptions
from stockade.core import leases as core_leases
from stockade.core.errors import InvalidArgument, InvariantViolation, LockTimeout, invariant
from stockade.core.leases import LeasePolicy
from stockade.core.limits import wait_deadline_ns
from stockade.transport.io import AsyncIO

if TYPE_CHECKING:
    from stockade.coordinators.postgres import PostgresCoordinator

__all__ = ["AsyncNotifiedCoordinatorPort", "OVERRUN_MS_MAX", "open_port"]

#: How long past the client's own wait deadline it keeps asking for the engine's verdict (clock rates differ).
OVERRUN_MS_MAX = 1_000
_OVERRUN_STEP_MS = 5


class AsyncNotifiedCoordinatorPort(AsyncEmbeddedCoordinatorPort):
    """The coordinator port (`AsyncCoordinatorPort`) over an engine that wakes its waiters.

    The backend says it is one by declaring `Capability.NATIVE_WAIT` (`open_port` reads that, not the engine).

    Args:
        engine: the engine; closed with the port.
        capabilities: what its backend declares.
    """

    def __init__(self, engine: PostgresCoordinator, *, capabilities: frozenset[Capability]) -> None:
        super().__init__(engine, capabilities=capabilities)
        invariant(Capability.NATIVE_WAIT in capabilities, "a port that waits to be woken over a backend that polls")
        self.waking = engine
        self.clock = SystemClock()  # the client's clock: K2's deadline; never the judge of expiry

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Acquire ``scope``, waiting in FIFO order up to ``wait_ms`` (measured by the server; None: until
        granted or cancelled, the waiter row kept alive by these attempts).

        Returns:
            The grant; its ``sent_ns`` is this client's clock when the granted
            attempt was sent (the start of the conservative lease deadline, K2).

        Raises:
            LockTimeout: still held (or others ahead) when ``wait_ms`` ran out.
        """
        lease_id = new_lease_id()
        # An attempt runs in a worker thread that a cancellation does not stop: the withdrawal
        # below takes the same gate, so it runs after any attempt still in flight and gives back
        # a grant that attempt made.
        gate = threading.Lock()
        give_up_ns = wait_deadline_ns(self.clock.now_ns(), None if wait_ms is None else wait_ms + OVERRUN_MS_MAX)
        server_deadline_ns: int | None = None
        try:
            while True:
                seen = self.waking.seen(scope)
                sent_ns = self.clock.now_ns()
                attempt = await AsyncIO.run_blocking(
                    self._attempt, gate, scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms,
                    wait_deadline_ns=server_deadline_ns,
                )
                server_deadline_ns = attempt.wait_deadline_ns
                outcome = attempt.outcome
                if isinstance(outcome, core_leases.Granted):
                    lease = outcome.lease
                    return Grant(lease.lease_id, lease.holder, lease.token, lease.ttl_ms, sent_ns)
                if isinstance(outcome, core_leases.TimedOut):
                    raise LockTimeout(scope, wait_ms or 0)
                invariant(isinstance(outcome, core_leases.Queued), f"unexpected outcome {outcome!r}")
                now_ns = self.clock.now_ns()
                if now_ns >= give_up_ns:
                    raise TimeoutError("the coordinator's clock did not reach the wait deadline")
                remaining_ms = (give_up_ns - now_ns) // 1_000_000 - OVERRUN_MS_MAX
                sleep_ms = min(attempt.retry_ms, remaining_ms) if remaining_ms > 0 else _OVERRUN_STEP_MS
                await AsyncIO.run_blocking(self.waking.wait_for_change, scope, seen, max(1, sleep_ms))
        except LockTimeout:
            raise
        except BaseException as exc:
            # Interrupted (cancelled, KeyboardInterrupt, backend error, our own give-up):
            # leave the queue and give back a grant that may have happened meanwhile.
            await AsyncIO.run_blocking(self._withdraw, gate, scope, lease_id)
            if isinstance(exc, TimeoutError):
                raise LockTimeout(scope, wait_ms or 0) from None
            raise

    def _attempt(self, gate: threading.Lock, scope: str, **arguments: Any) -> Any:
        with gate:
            return self.waking.attempt(scope, **arguments)

    def _withdraw(self, gate: threading.Lock, scope: str, lease_id: str) -> None:
        """Leave the queue and give back a grant an interrupted acquire may have made (after its attempt)."""
        with gate:
            try:
                self.engine.cancel_wait(scope, lease_id)
                self.engine.release(lease_id)
            except InvariantViolation:
                raise
            except Exception:  # noqa: BLE001 - best effort: the lease, if any, expires by TTL
                pass


def open_port(options: PortOptions) -> AsyncEmbeddedCoordinatorPort:
    """The ``postgresql://`` and ``postgres://`` entries of `stockade.coordinators.registry`: the coordinator's
    tables in that server, its waiters woken by LISTEN/NOTIFY.

    Raises:
        InvalidArgument: no server in the url, or an option only a remote backend takes.
        BackendUnavailable: the server cannot be reached, or psycopg is not installed.
    """
    options.refuse(*REMOTE_OPTIONS)
    scheme = options.url.partition("://")[0]
    if not options.location or "\x00" in options.location:
        raise InvalidArgument("url", f"{scheme} url needs a server: {scheme}://user@host:5432/dbname")
    from stockade.coordinators.postgres import open_postgres  # psycopg only when asked for

    engine = open_postgres(options.url, LeasePolicy(lock_delay_ms=options.lock_delay_ms))
    if Capability.NATIVE_WAIT in options.capabilities:  # declared by the registry entry, not guessed
        return AsyncNotifiedCoordinatorPort(engine, capabilities=options.capabilities)
    return AsyncEmbeddedCoordinatorPort(engine, capabilities=options.capabilities)
