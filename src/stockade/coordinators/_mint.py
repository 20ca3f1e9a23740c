"""Where lease ids and cluster ids are minted: one home for each, so each has one format.

- A **lease id** is the secret a holder renews and releases by: `LEASE_ID_BYTES` random bytes of the
  OS's CSPRNG, URL-safe base64 without padding (32 characters, as `secrets.token_urlsafe`). The core
  checks the shape (`stockade.core.leases`); it never mints one (it has no randomness).
  `new_lease_id` mints one per call; `LeaseIds` mints the same ids from a pool filled
  `LEASE_ID_POOL` at a time (the server: one ``getrandom`` per 128 grants instead of one per grant).
- A **queue ticket** names a wait until granted (``wait_ms=None``) that the HTTP client resumes across
  the server's per-request caps: minted like a lease id (`new_wait_ticket`), and as secret.
- A **cluster id** is the id every token of a coordinator carries (C1):
  `stockade.core.tokens.CLUSTER_ID_HEX_DIGITS` lowercase hex digits, minted once when a coordinator's
  state is created (a file, a PostgreSQL schema, an etcd or ZooKeeper prefix, a memory coordinator).
  The simulator passes its seeded random source, so a seed replays the same cluster id.
"""

from __future__ import annotations

import base64
import os
import random
import secrets

from stockade.core.tokens import CLUSTER_ID_HEX_DIGITS

__all__ = ["LEASE_ID_BYTES", "LEASE_ID_POOL", "LeaseIds", "new_cluster_id", "new_lease_id", "new_wait_ticket"]

#: 192 random bits: a lease id is a bearer secret (whoever knows it can renew and release).
LEASE_ID_BYTES = 24
#: How many lease ids `LeaseIds` draws from the OS at once.
LEASE_ID_POOL = 128


def new_lease_id() -> str:
    """A fresh lease id: 192 random bits, URL-safe. Treat it as a secret."""
    return secrets.token_urlsafe(LEASE_ID_BYTES)


def new_wait_ticket() -> str:
    """A fresh queue ticket (a wait until granted resumed across a server's per-request caps): the format of
    a lease id, and as secret (whoever sends it takes over the wait's place and its grant)."""
    return secrets.token_urlsafe(LEASE_ID_BYTES)


class LeaseIds:
    """Fresh lease ids, as `new_lease_id` makes them, from a pool of OS randomness.

    Same CSPRNG and format as `new_lease_id`; one ``getrandom`` per `LEASE_ID_POOL` ids.
    Not thread-safe: one per event loop.
    """

    __slots__ = ("_pool", "_at")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at + LEASE_ID_BYTES > len(self._pool):
            self._pool, at = os.urandom(LEASE_ID_BYTES * LEASE_ID_POOL), 0
        self._at = at + LEASE_ID_BYTES
        return base64.urlsafe_b64encode(self._pool[at:at + LEASE_ID_BYTES]).decode("ascii")


def new_cluster_id(rng: random.Random | None = None) -> str:
    """A fresh cluster id: `CLUSTER_ID_HEX_DIGITS` hex digits, from the OS's CSPRNG, or from ``rng`` (the
    simulator's seeded source: the same seed, the same id)."""
    if rng is not None:
        return f"{rng.getrandbits(CLUSTER_ID_HEX_DIGITS * 4):0{CLUSTER_ID_HEX_DIGITS}x}"
    return secrets.token_hex(CLUSTER_ID_HEX_DIGITS // 2)
