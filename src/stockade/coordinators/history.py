"""Reading a coordinator's lease history, whatever keeps it (docs/history.md).

The embedded coordinators journal every grant, expiry and release in the
same unit of work as the change (`stockade.coordinators._history`): the SQLite
file in a table of its own, ``memory://`` in memory. ``stockade serve`` keeps
its table in memory and group-commits it to its coordinator file, journal
included, so its history is read from the file: what has committed. The
PostgreSQL coordinator journals in a table of its own, in the transaction of
each change (`stockade.coordinators.postgres._journal`): its record store
is `Journaled`, read here as memory's and the SQLite file's are. The etcd
coordinator keeps its journal in etcd, written in the Txn of each change
(`stockade.coordinators.etcd._journal`) and read through its port
(`stockade.coordinators.etcd._async.history`); the ZooKeeper coordinator keeps it in
the ensemble, written in the transaction of each change
(`stockade.coordinators.zookeeper._journal`), and its client port reads it. Neither is
read through this module.
"""

from __future__ import annotations

from stockade.coordinators._history import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, Journaled, events_of
from stockade.core.errors import InvalidArgument
from stockade.core.limits import validate_int, validate_scope

__all__ = ["HistoryEvent", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "history_of", "events_of"]


def history_of(records: object, scope: str, limit: int = HISTORY_PER_SCOPE) -> list[HistoryEvent]:
    """The last ``limit`` events of ``scope`` in a record store, oldest first.

    Raises:
        InvalidArgument: a bad scope or limit, or a record store that keeps no history.
    """
    validate_scope(scope)
    validate_int("limit", limit, 1, HISTORY_PER_SCOPE)
    if isinstance(records, Journaled):  # memory://, the SQLite file, PostgreSQL: each reads its own journal
        return records.history(scope, limit)
    raise InvalidArgument("url", f"this coordinator ({type(records).__name__}) keeps no lease history")
