"""What anyone can see of an election: the current leader (sync and async clients share it; not generated)."""

from __future__ import annotations

from dataclasses import dataclass

from stockade.core.errors import InvalidArgument
from stockade.core.leases import ScopeInfo, ScopeState
from stockade.core.limits import validate_int
from stockade.core.tokens import FencingToken

__all__ = ["LeaderInfo", "leader_of", "changed", "validate_watch", "POLL_MS_DEFAULT", "POLL_MS_MIN", "POLL_MS_MAX"]

#: `watch_leader` asks the coordinator this often; bounded both ways so that a
#: watch neither floods the coordinator nor misses a whole lease.
POLL_MS_DEFAULT = 100
POLL_MS_MIN = 10
POLL_MS_MAX = 10_000
#: The longest one `watch_leader` call waits (as ``wait_ms`` of an acquire): 5 minutes.
WATCH_TIMEOUT_MS_MAX = 300_000


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads an election now, as the coordinator shows it.

    Attributes:
        name: the election (its scope).
        holder: the leader's published identity (``identity=`` of `elect`,
            e.g. the ``host:port`` followers forward to).
        token: the leadership's token, without its MAC: it identifies the
            term (compare ``token.value``), it cannot write.
        remaining_ms: how long the lease runs without a renewal, by the
            coordinator's clock when it answered.
    """

    name: str
    holder: str
    token: FencingToken
    remaining_ms: int

    @property
    def term(self) -> int:
        """The term's number: the token's value. A newer leader always has a greater one (C1)."""
        return self.token.value


def leader_of(info: ScopeInfo) -> LeaderInfo | None:
    """The leader shown by a scope's state, or None (free, or in its lock-delay)."""
    if info.state is not ScopeState.HELD or info.holder is None or info.token is None:
        return None
    return LeaderInfo(name=info.scope, holder=info.holder, token=info.token, remaining_ms=info.remaining_ms)


def _term(leader: LeaderInfo | None) -> int:
    return 0 if leader is None else leader.term


def changed(since: LeaderInfo | None, now: LeaderInfo | None) -> bool:
    """True when ``now`` is another term than ``since`` (a new leader, or none any more)."""
    return _term(since) != _term(now)


def validate_watch(since: object, timeout_ms: object, poll_ms: object) -> None:
    """Checks `watch_leader`'s arguments before any I/O.

    Raises:
        InvalidArgument: ``since`` is not a `LeaderInfo` or None, or a bound is out of range.
    """
    if since is not None and not isinstance(since, LeaderInfo):
        raise InvalidArgument("since", f"must be a LeaderInfo or None, got {type(since).__name__}")
    validate_int("timeout_ms", timeout_ms, 0, WATCH_TIMEOUT_MS_MAX)
    validate_int("poll_ms", poll_ms, POLL_MS_MIN, POLL_MS_MAX)
