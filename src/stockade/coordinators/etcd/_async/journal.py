"""The etcd port's lease history: the heads it journals after, reading a scope's events, the global cap.

The Txns that write the journal are the change's own (`stockade.coordinators.etcd`,
`stockade.coordinators.etcd._journal`); this module keeps what the port needs
around them: each scope's history head as last seen (so a grant or release
journals without a read; a wrong guess fails the Txn's compare, writes nothing,
and is retried with the head read back), the reading of a scope's events, and
the sweep that keeps the whole journal under `HISTORY_TOTAL_MAX`.

The sweep is amortized: each Txn that journals sets it due with a chance of
`SWEEP_CHANCE`, so about one in a thousand of them, cluster-wide and whatever
the number of processes, is followed by one count of the journal's keys (a
``count_only`` range, no raft entry) at the port's next acquire; past the cap,
the oldest events (by mod revision) are deleted in Txns of
`SWEEP_OPS_PER_TXN`. Between sweeps the journal may pass the cap by the events
written since the last one.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

from stockade.coordinators import etcd as recipe
from stockade.coordinators.etcd import _journal as journal
from stockade.coordinators.journal import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent
from stockade.core.errors import BackendUnavailable
from stockade.core.limits import validate_int, validate_scope

if TYPE_CHECKING:
    from stockade.coordinators.etcd._async.port import AsyncEtcdCoordinatorPort

__all__ = ["AsyncEtcdJournal", "SWEEP_CHANCE", "HEADS_MAX", "now_ms", "head_in"]

#: History heads remembered (per scope) to journal without a read.
HEADS_MAX = 10_000
#: Each Txn that journals makes the next acquire sweep the global cap with this chance.
SWEEP_CHANCE = 1 / 1000

log = logging.getLogger("stockade.etcd")


def now_ms() -> int:
    """The writer's wall clock for a history event (etcd keeps none a client can read)."""
    return time.time_ns() // 1_000_000


def head_in(read: dict[str, Any]) -> journal.Head:
    """The history head in a Txn's range answer (none yet: the empty head)."""
    return journal.head_of(next(iter(recipe.kvs_of(read.get("response_range", {}))), None))


class AsyncEtcdJournal:
    """What one `AsyncEtcdCoordinatorPort` knows of the history (see the module docstring).

    Attributes:
        total_max: the global cap (tests lower it).
        sweep_chance: the chance that a journaling Txn makes a sweep due (tests raise it).
    """

    def __init__(self, port: AsyncEtcdCoordinatorPort, layout: recipe.Layout) -> None:
        self._port = port
        self._layout = layout
        self._heads: dict[str, journal.Head] = {}
        self.total_max = HISTORY_TOTAL_MAX
        self.sweep_chance = SWEEP_CHANCE
        self.sweep_due = False
        self._rng = random.Random()

    async def head(self, scope: str) -> journal.Head:
        """The scope's head as last seen here, else read (one range, no raft entry)."""
        head = self._heads.get(scope)
        if head is None:
            head = head_in({"response_range": await self._port._range(self._layout.head_key(scope))})
            self.remember(scope, head)
        return head

    def known(self, scope: str) -> journal.Head | None:
        return self._heads.get(scope)

    def remember(self, scope: str, head: journal.Head) -> None:
        if len(self._heads) >= HEADS_MAX and scope not in self._heads:
            self._heads.clear()
        self._heads[scope] = head

    def journaled(self, scope: str, head: journal.Head) -> None:
        """A Txn wrote the scope's history up to ``head``: remember it; now and then, make a sweep due."""
        self.remember(scope, head)
        if self._rng.random() < self.sweep_chance:
            self.sweep_due = True

    async def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first: one range over ``h/<scope>/``.

        Raises:
            InvalidArgument: a bad scope or limit.
            BackendUnavailable: etcd cannot answer, or its revision went back (a restore) since
                this process last read it.
        """
        validate_scope(scope)
        validate_int("limit", limit, 1, HISTORY_PER_SCOPE)
        start = self._layout.journal_prefix(scope)
        answer = await self._port._range(start, recipe.prefix_end(start), sort_order="DESCEND", sort_target="KEY",
                                         limit=str(limit))
        return journal.events_of_range(scope, recipe.kvs_of(answer))

    async def sweep(self) -> int:
        """Delete the oldest events past `total_max`; how many. Best effort: a failure is logged, and
        the next acquire tries again."""
        try:
            deleted = await self._sweep()
        except BackendUnavailable as exc:
            log.info("history sweep failed; tried again at the next acquire", extra={"error": repr(exc)})
            return 0
        self.sweep_due = False
        return deleted

    async def _sweep(self) -> int:
        root = self._layout.journal_root
        counted = await self._port._range(root, recipe.prefix_end(root), count_only=True)
        excess = min(int(counted.get("count", 0)) - self.total_max, journal.SWEEP_DELETES_MAX)
        if excess <= 0:
            return 0
        oldest = recipe.kvs_of(await self._port._range(root, recipe.prefix_end(root), sort_order="ASCEND",
                                                        sort_target="MOD", limit=str(excess), keys_only=True))
        for at in range(0, len(oldest), journal.SWEEP_OPS_PER_TXN):
            batch = oldest[at:at + journal.SWEEP_OPS_PER_TXN]
            await self._port._txn({"success": [{"request_delete_range": {"key": recipe.b64(kv.key)}} for kv in batch]})
        return len(oldest)
