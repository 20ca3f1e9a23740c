"""stockade.core: the rules, with no I/O.

- `tokens`: the fencing token value and its encoded form.
- `leases`: the lease table (grant, renew, release, expire, FIFO waiters, lock-delay).
- `fence`: the fence rule every resource applies (R1, R2) and the order of a write's checks (R2, R3, R1).
- `values`: the values resources return (`WriteResult`, `Item`, ...) and the `Write` they are asked to make.
- `limits`: every bound, named, with validators.
- `errors`: the one exception tree, and `invariant()`.

Nothing here imports time, random, socket, sqlite3, asyncio or threading
(a test enforces it): time comes in as ``now_ns``, randomness as arguments.
"""

from stockade.core import errors, fence, leases, limits, tokens, values
from stockade.core.clock import Clock

__all__ = ["errors", "fence", "leases", "limits", "tokens", "values", "Clock"]
