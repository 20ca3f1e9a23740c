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

    Same CSPRNG and format as `new_lease_id`; one ``getrandom`` per `LEASE_ID_POOL` ids, encoded
    at once: `LEASE_ID_BYTES` is a multiple of 3, so each id's characters are its own bytes'
    base64 (no padding, no character shared with the next id), cut from the pool's.
    Not thread-safe: one per event loop.
    """

    __slots__ = ("_pool", "_at")

    def __init__(self) -> None:
        self._pool = ""  # the pool's ids, encoded
        self._at = _POOL_CHARS  # the next id's first character

    def __call__(self) -> str:
        at = self._at
        if at == _POOL_CHARS:
            self._pool, at = base64.urlsafe_b64encode(os.urandom(LEASE_ID_BYTES * LEASE_ID_POOL)).decode("ascii"), 0
        self._at = at + _ID_CHARS
        return self._pool[at:at + _ID_CHARS]


_ID_CHARS = LEASE_ID_BYTES // 3 * 4  # the characters of one lease id (no padding: 24 bytes are 8 groups of 3)
_POOL_CHARS = _ID_CHARS * LEASE_ID_POOL


def new_cluster_id(rng: random.Random | None = None) -> str:
    """A fresh cluster id: `CLUSTER_ID_HEX_DIGITS` hex digits, from the OS's CSPRNG, or from ``rng`` (the
    simulator's seeded source: the same seed, the same id)."""
    if rng is not None:
        return f"{rng.getrandbits(CLUSTER_ID_HEX_DIGITS * 4):0{CLUSTER_ID_HEX_DIGITS}x}"
    return secrets.token_hex(CLUSTER_ID_HEX_DIGITS // 2)
