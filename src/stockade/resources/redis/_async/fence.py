"""`AsyncRedisFence` and its batches over ``redis.asyncio`` (`stockade.resources.redis`; docs/fence-redis.md).

The async source; the sync `RedisFence` (``_sync/``) is generated from it by scripts/unasync.py.
What both share without I/O (the batch's commands, the checks before and after a script call) is
`stockade.resources.redis._base` and `stockade.resources.redis._batch.FenceCore`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as redis_asyncio
from redis import RedisError
from redis.exceptions import NoScriptError

from stockade.core.errors import LimitExceeded
from stockade.core.limits import VALUE_BYTES_MAX, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources._admit import effective_mark
from stockade.resources._verify import UNSIGNED, refuse_unsigned_after_signed
from stockade.resources.redis import _script as script
from stockade.resources.redis._base import _Batch, _FenceBase, _infos, _policy_unread, _translate
from stockade.resources.redis._batch import SCAN_SCOPES_MAX, Commands, scope_of_mark_key

__all__ = ["AsyncRedisFence", "AsyncRedisBatch"]


class AsyncRedisBatch(_Batch):
    """A fenced batch of `AsyncRedisFence` (see `RedisFence.batch`)."""

    def __init__(self, fence: AsyncRedisFence, token: FencingToken, scope: str | None) -> None:
        super().__init__(token, scope, fence.value_bytes_max)
        self._fence = fence

    async def get(self, key: str) -> bytes | None:
        """``key`` as this batch sees it: its own buffered SET/DEL, else Redis, checked against the mark.

        Raises:
            StaleToken: the mark has passed the batch's token (the batch would be refused anyway).
            InvalidArgument: a key outside the scope, or one with a buffered HSET/INCRBY/XADD.
        """
        known, value = self._buffered(key)
        if known:
            return value
        return await self._fence._checked_read(self.token, self._commands, key)


class AsyncRedisFence(_FenceBase):
    """Fenced writes to a user's Redis (redis-py ``redis.asyncio.Redis`` or ``RedisCluster``).

    Args:
        client: the user's client. Replies may be bytes or str.
        keys: what token MACs are verified with (`stockade.keys.FixedKeys`, a
            `KeyFile`, a keyring path; ``"unsigned"``: none, unsafe, docs/tokens.md). None is refused (L2).
        cluster_id: the coordinator cluster trusted (default: the keys' own).
        value_bytes_max: the largest value a command may write.

    Raises:
        InvalidArgument: keys of another cluster, or no cluster id.
    """

    def __init__(
        self, client: Any, *, keys: object = None, cluster_id: str | None = None, value_bytes_max: int = VALUE_BYTES_MAX
    ) -> None:
        super().__init__(client, keys=keys, cluster_id=cluster_id, value_bytes_max=value_bytes_max)
        from redis.asyncio.cluster import RedisCluster as Cluster  # this side's cluster client

        self._cluster = isinstance(client, Cluster)

    @classmethod
    def from_url(
        cls, url: str, *, keys: object, cluster_id: str | None = None, value_bytes_max: int = VALUE_BYTES_MAX,
        **options: Any,
    ) -> AsyncRedisFence:
        """A fence over a new client for ``url`` (``redis://host:port/db``; redis-py's options)."""
        return cls(redis_asyncio.Redis.from_url(url, **options), keys=keys, cluster_id=cluster_id,
                   value_bytes_max=value_bytes_max)

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncRedisFence:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @asynccontextmanager
    async def batch(self, token: FencingToken | str, *, scope: str | None = None) -> AsyncIterator[AsyncRedisBatch]:
        """A fenced batch: ``async with fence.batch(token) as b:``; the block buffers commands, its end
        applies them in one script call.

        Nothing is applied if the block raises or the token is refused. An empty
        batch with a ``scope`` still checks the token and raises the mark.

        Raises:
            StaleToken, TokenMismatch: refused (R1, R2, forged); nothing applied.
            InvalidArgument: a bad token, key or value, or a batch Redis would refuse a command of (a
                key's type, an INCRBY it cannot read or that would overflow, a stream at its last id):
                nothing applied, no mark moved (docs/fence-redis.md, "All or nothing").
            BackendUnavailable: Redis could not be reached; outcome unknown (the whole batch or none of it).
        """
        checked, scope = self._open(token, scope)
        unit = AsyncRedisBatch(self, checked, scope)
        yield unit
        unit.results = await self._apply(checked, unit._commands)

    async def set(self, token: FencingToken | str, key: str, value: bytes | str, *, px_ms: int | None = None) -> bool:
        """Fenced ``SET key value [PX px_ms]``; True. Raises as `batch`."""
        # A batch of one SET, by its own script (`script.FENCED_SET`): the hot path.
        checked, why, scope, keys, args = self._set_call(token, key, value, px_ms)
        await self._clear_to_write(checked, scope, why is None)
        try:
            reply = await self._evalsha(self._set, keys, args)
        except RedisError as error:
            raise _translate(error, self.resource) from error
        if reply != 1:
            self.judge_status(checked, scope, reply)
        return True

    async def delete(self, token: FencingToken | str, *keys: str) -> int:
        """Fenced ``DEL``; how many of ``keys`` existed. Raises as `batch`."""
        checked, commands = self._single(token)
        for key in keys:
            commands.delete(key)
        return sum(await self._apply(checked, commands))

    async def hset(self, token: FencingToken | str, key: str, mapping: Mapping[str, bytes | str]) -> int:
        """Fenced ``HSET``; how many fields were new. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.hset(key, mapping)
        return int((await self._apply(checked, commands))[0])

    async def incrby(self, token: FencingToken | str, key: str, amount: int) -> int:
        """Fenced ``INCRBY``; the new value. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.incrby(key, amount)
        return int((await self._apply(checked, commands))[0])

    async def xadd(
        self, token: FencingToken | str, key: str, fields: Mapping[str, bytes | str], *, maxlen: int | None = None
    ) -> str:
        """Fenced ``XADD key [MAXLEN ~ maxlen] * ...``; the entry's id. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.xadd(key, fields, maxlen=maxlen)
        return str((await self._apply(checked, commands))[0])

    async def high_water(self, scope: str) -> int:
        """``scope``'s mark: its own or its slot's default floor, the greater (0 if neither)."""
        scope = validate_scope(scope)
        try:
            own, floor = await self.client.mget([script.hwm_key(scope), script.floor_key(scope)])
        except RedisError as error:
            raise _translate(error, self.resource) from error
        return effective_mark(int(own or 0), int(floor or 0))

    async def high_waters(self) -> dict[str, int]:
        """Every scope that has a mark of its own, with its mark (a bounded SCAN).

        Raises:
            LimitExceeded: more than `SCAN_SCOPES_MAX` scopes.
        """
        scopes: list[str] = []
        try:
            async for key in self.client.scan_iter(match=f"{script.HWM_PREFIX}*", count=1000):
                scope = scope_of_mark_key(key)
                if scope is not None:
                    scopes.append(scope)
                    if len(scopes) > SCAN_SCOPES_MAX:
                        raise LimitExceeded("SCAN_SCOPES_MAX", SCAN_SCOPES_MAX, "too many scopes to list")
        except RedisError as error:
            raise _translate(error, self.resource) from error
        return {scope: await self.high_water(scope) for scope in sorted(set(scopes))}

    async def raise_high_waters(
        self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0
    ) -> dict[str, int]:
        """Raise each named scope's mark to its floor and every slot's default floor to ``default`` (R4).

        Never lowers a mark. On one Redis server it is one script call (all or
        nothing); on Redis Cluster one pipelined call per key, each in its slot
        (not atomic across slots; raising again completes an interrupted run).

        Args:
            floors: scope -> floor, or a `FenceFloors` (its default counts too).
            default: the floor of every scope, named or not, including ones never seen.

        Returns:
            The named scopes' marks after.

        Raises:
            InvalidArgument: a bad scope or floor (nothing changes).
            BackendUnavailable: Redis could not be reached; raising again is safe.
        """
        keys, args, named, _ = self.floors_call(floors, default, every_slot=True)
        await self._check_policy()  # a raised mark evicted would be a floor lost
        try:
            if not self._cluster:
                return self.marks_after(named, await self._raise(keys=keys, args=args) if keys else [])
            # One call per key (each stays in its slot), pipelined: redis-py routes each by its key.
            sha = await self.client.script_load(script.RAISE_MARKS)
            pipe = self.client.pipeline()
            for key, floor in zip(keys, args, strict=True):
                pipe.execute_command("EVALSHA", sha, 1, key, floor)
            return self.marks_after(named, [marks[0] for marks in await pipe.execute()])
        except RedisError as error:
            raise _translate(error, self.resource) from error

    # -- the I/O of a batch ----------------------------------------------------------------------

    async def _check_policy(self) -> None:
        now_ns = time.monotonic_ns()
        if self.policy_due(now_ns):
            try:
                self.judge_policy(_infos(await self._info_call()), now_ns)
            except RedisError as error:
                raise _policy_unread(error, self.resource) from error

    async def _apply(self, token: FencingToken, commands: Commands) -> list[Any]:
        if commands.scope is None:
            return []  # no key, no scope: nothing to fence
        await self._clear_to_write(token, commands.scope, self._tokens.check(token)[1] is None)
        keys, args = commands.script_call(token, self._compare, self.memory, self._cluster)
        try:
            reply = await self._evalsha(self._write, keys, args)
        except RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge(token, commands, reply)

    async def _clear_to_write(self, token: FencingToken, scope: str, verified: bool) -> None:
        """What a write checks before its script: the eviction policy, the token (``verified``: its MAC passed)
        against this handle's cluster and ``scope`` (R2), and on a cluster the memory of verifying."""
        await self._check_policy()
        if not (verified and self.rule_passes(token, scope)):
            self.admit(token, scope, await self.high_water(scope))
        if self._cluster and not self._memory_seen:
            try:
                if self.memory == "v":
                    await self.client.set(script.VERIFIED_KEY, "1")
                elif self.memory == "u" and await self.client.exists(script.VERIFIED_KEY):
                    refuse_unsigned_after_signed(self.resource, True, UNSIGNED)
            except RedisError as error:
                raise _translate(error, self.resource) from error
            self._memory_seen = True

    async def _evalsha(self, lua: Any, keys: Sequence[str | bytes], args: Sequence[str | bytes]) -> Any:
        """The registered script ``lua`` by EVALSHA, loaded again on NOSCRIPT (after a restart, a failover or
        SCRIPT FLUSH): what redis-py's ``Script`` call does, without its checks for pipelines on every write."""
        try:
            return await self.client.evalsha(lua.sha, len(keys), *keys, *args)
        except NoScriptError:
            lua.sha = await self.client.script_load(lua.script)
            return await self.client.evalsha(lua.sha, len(keys), *keys, *args)

    async def _checked_read(self, token: FencingToken, commands: Commands, key: str) -> bytes | None:
        assert commands.scope is not None
        if not self.premise(token, commands.scope):
            self.admit(token, commands.scope, await self.high_water(commands.scope))
        try:
            reply = await self._read(keys=[script.hwm_key(commands.scope), script.floor_key(commands.scope), key])
        except RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge_read(token, commands.scope, key, reply)
