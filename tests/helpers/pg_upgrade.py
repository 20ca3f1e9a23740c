"""What a migration of the PostgreSQL coordinator's schema must carry over, for the tests of each migration."""

from __future__ import annotations

from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.leases import Granted


def lease_carried_over(url: str, held: Granted) -> None:
    """A lease granted before the migration, by a coordinator of the new schema: renewed with its token,
    released, and its scope granted again with a higher token."""
    new = PostgresCoordinator(url)
    try:
        assert new.renew(held.lease.lease_id).token.value == held.lease.token.value
        assert new.release(held.lease.lease_id).released
        again = new.attempt(held.lease.scope, lease_id=new_lease_id(), holder="new", ttl_ms=60_000, wait_ms=0).outcome
        assert isinstance(again, Granted) and again.lease.token.value > held.lease.token.value
    finally:
        new.close()
