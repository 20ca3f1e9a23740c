"""Fence a user's own Redis data: the HWM lives in Redis and moves in the same script as the writes.

    fence = RedisFence(redis.Redis(...), keys=coord.verify_keys())
    fence.set(lease.token, "{orders}:42", b"paid")
    with fence.batch(lease.token) as b:
        b.set("{orders}:42", b"shipped")
        b.hset("{orders}:42:meta", {"by": "w1"})
        b.xadd("{orders}:log", {"event": "shipped"})
    b.results  # [True, 1, "1700000000000-0"]

Every fenced write is one call of a Lua script (`_redis_script.FENCED_WRITE`,
by EVALSHA; loaded again on NOSCRIPT) that reads the scope's mark,
refuses a stale token (R1) and otherwise raises the mark and runs the
commands, atomically: Redis runs a script alone. The token's MAC and its
cluster and scope (R2) are checked here, in Python, before the script runs:
the script holds no key. Reads are plain Redis reads, except `RedisBatch.get`,
which reads a key and the mark at one instant and refuses if the mark has
already passed the batch's token (a batch never sees a newer holder's data).

Keys must carry the scope as their hash tag (``{orders}:42``), so that a
scope's keys and its mark share one hash slot on Redis Cluster; a key outside
it is refused with `InvalidArgument`. docs/fence-redis.md says what
durability each ``appendfsync`` gives and what to do after a failover (R4).
`AsyncRedisFence` is the same over ``redis.asyncio``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument, InvariantViolation, LimitExceeded
from stockade.core.limits import VALUE_BYTES_MAX, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources._inputs import coerce_token
from stockade.resources._verify import TOKENLESS, UNSIGNED, check_keys_given, refuse_unsigned_after_signed
from stockade.resources.redis import _script as script
from stockade.resources.redis._batch import SCAN_SCOPES_MAX, Commands, FenceCore, scope_of_mark_key

try:
    import redis as redis_py
    import redis.asyncio as redis_asyncio
    from redis.cluster import RedisCluster
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError("stockade.resources.redis needs redis-py: pip install 'stockade[redis]'") from error

__all__ = ["RedisFence", "AsyncRedisFence", "RedisBatch", "AsyncRedisBatch", "open_floor_target"]

#: The code of the errors the script's first pass reports before any write: Redis would refuse a command
#: of the batch (its data's type, an integer it cannot read or that would overflow), so nothing is applied.
_REFUSED_BY_SCRIPT = "FENCEBATCH"
#: The code the script answers with if a command fails all the same after a write: a bug in its first pass.
_PARTIAL = "FENCEPARTIAL"


def _translate(error: Exception, resource: str) -> Exception:
    """A redis-py error as stockade's: the user's data refused the batch, or Redis failed."""
    text = str(error)
    if isinstance(error, redis_py.ResponseError) and text.startswith(_REFUSED_BY_SCRIPT):
        return InvalidArgument("batch", f"refused by {resource}, nothing applied: {text}")
    if isinstance(error, redis_py.ResponseError) and text.startswith(_PARTIAL):
        return InvariantViolation(f"{resource}: a fenced batch failed halfway, its first pass missed it: {text}")
    return BackendUnavailable(f"{resource}: {text}")


def _resource_name(client: Any) -> str:
    if isinstance(client, RedisCluster) or not hasattr(client, "connection_pool"):
        node = client.get_default_node() if hasattr(client, "get_default_node") else None
        return f"redis-cluster:{getattr(node, 'host', '?')}:{getattr(node, 'port', '?')}"
    kwargs = getattr(client.connection_pool, "connection_kwargs", {})
    if "path" in kwargs:
        return f"redis:unix:{kwargs['path']}/{kwargs.get('db', 0)}"
    return f"redis:{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


class _Batch:
    """The buffered commands of one fenced unit; applied at the end of its ``with`` block."""

    def __init__(self, token: FencingToken, scope: str | None, value_bytes_max: int) -> None:
        self.token = token
        self._commands = Commands(scope, value_bytes_max=value_bytes_max)
        #: The commands' results in order (True for SET, ints for DEL/HSET/INCRBY, ids for XADD),
        #: set when the batch was applied.
        self.results: list[Any] = []

    @property
    def scope(self) -> str | None:
        """The batch's scope: named at its opening, or the hash tag of its first key."""
        return self._commands.scope

    def set(self, key: str, value: bytes | str, *, px_ms: int | None = None) -> None:
        """Buffer ``SET key value [PX px_ms]``."""
        self._commands.set(key, value, px_ms=px_ms)

    def delete(self, key: str) -> None:
        """Buffer ``DEL key`` (its result: 1 if the key existed)."""
        self._commands.delete(key)

    def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None:
        """Buffer ``HSET key field value ...`` (its result: how many fields were new)."""
        self._commands.hset(key, mapping)

    def incrby(self, key: str, amount: int) -> None:
        """Buffer ``INCRBY key amount`` (its result: the new value)."""
        self._commands.incrby(key, amount)

    def xadd(self, key: str, fields: Mapping[str, bytes | str], *, maxlen: int | None = None) -> None:
        """Buffer ``XADD key [MAXLEN ~ maxlen] * field value ...`` (its result: the entry's id)."""
        self._commands.xadd(key, fields, maxlen=maxlen)

    def _buffered(self, key: str) -> tuple[bool, bytes | None]:
        key = self._commands.check_key(key)
        if key not in self._commands.written:
            return False, None
        value = self._commands.written[key]
        if value is ...:
            raise InvalidArgument("key", f"{key!r} has a buffered HSET, INCRBY or XADD: read it after the batch")
        return True, value


class RedisBatch(_Batch):
    """A fenced batch of `RedisFence` (see `RedisFence.batch`)."""

    def __init__(self, fence: RedisFence, token: FencingToken, scope: str | None) -> None:
        super().__init__(token, scope, fence.value_bytes_max)
        self._fence = fence

    def get(self, key: str) -> bytes | None:
        """``key`` as this batch sees it: its own buffered SET/DEL, else Redis, checked against the mark.

        Raises:
            StaleToken: the mark has passed the batch's token (the batch would be refused anyway).
            InvalidArgument: a key outside the scope, or one with a buffered HSET/INCRBY/XADD.
        """
        known, value = self._buffered(key)
        if known:
            return value
        return self._fence._checked_read(self.token, self._commands, key)


class _FenceBase(FenceCore):
    def __init__(self, client: Any, *, keys: object, cluster_id: str | None, value_bytes_max: int) -> None:
        check_keys_given(keys)  # L2: None never means unsigned
        super().__init__(keys=keys, cluster_id=cluster_id, value_bytes_max=value_bytes_max,
                         resource=_resource_name(client))
        self.client = client
        self._cluster = isinstance(client, RedisCluster)
        self._write = client.register_script(script.FENCED_WRITE)
        self._raise = client.register_script(script.RAISE_MARKS)
        self._read = client.register_script(script.READ_CHECKED)

    def _open(self, token: object, scope: str | None) -> tuple[FencingToken, str | None]:
        return coerce_token(token), None if scope is None else validate_scope(scope)

    def _single(self, token: object) -> tuple[FencingToken, Commands]:
        # One command: a batch of one, without the context manager (the common, fast path).
        return coerce_token(token), Commands(None, value_bytes_max=self.value_bytes_max)

    def _info_call(self) -> Any:
        """``INFO memory`` of the server, or of every primary of a cluster (a dict per node)."""
        if self._cluster:
            return self.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return self.client.info("memory")


def _policy_unread(error: Exception, resource: str) -> Exception:
    """The eviction policy could not be read: say why the fence needs it when the user may not run INFO."""
    if isinstance(error, redis_py.exceptions.NoPermissionError):
        return BackendUnavailable(f"{resource}: a fence reads INFO memory before it writes, to make sure Redis cannot "
                                  f"evict its marks (maxmemory-policy), and this user may not: grant it +info "
                                  f"(docs/fence-redis.md)", certain_no_effect=True)
    return _translate(error, resource)


def _infos(answer: Any) -> list[Any]:
    """The ``INFO memory`` answers, one per server, from one server's or from a cluster's (keyed by node)."""
    if isinstance(answer, Mapping) and "maxmemory_policy" not in answer:
        return list(answer.values())
    return [answer]


class RedisFence(_FenceBase):
    """Fenced writes to a user's Redis (redis-py ``Redis`` or ``RedisCluster``).

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

    @classmethod
    def from_url(
        cls, url: str, *, keys: object, cluster_id: str | None = None, value_bytes_max: int = VALUE_BYTES_MAX,
        **options: Any,
    ) -> RedisFence:
        """A fence over a new client for ``url`` (``redis://host:port/db``; redis-py's options)."""
        return cls(redis_py.Redis.from_url(url, **options), keys=keys, cluster_id=cluster_id,
                   value_bytes_max=value_bytes_max)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RedisFence:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def batch(self, token: FencingToken | str, *, scope: str | None = None) -> Iterator[RedisBatch]:
        """A fenced batch: the block buffers commands, its end applies them in one script call.

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
        unit = RedisBatch(self, checked, scope)
        yield unit
        unit.results = self._apply(checked, unit._commands)

    def set(self, token: FencingToken | str, key: str, value: bytes | str, *, px_ms: int | None = None) -> bool:
        """Fenced ``SET key value [PX px_ms]``; True. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.set(key, value, px_ms=px_ms)
        return bool(self._apply(checked, commands)[0])

    def delete(self, token: FencingToken | str, *keys: str) -> int:
        """Fenced ``DEL``; how many of ``keys`` existed. Raises as `batch`."""
        checked, commands = self._single(token)
        for key in keys:
            commands.delete(key)
        return sum(self._apply(checked, commands))

    def hset(self, token: FencingToken | str, key: str, mapping: Mapping[str, bytes | str]) -> int:
        """Fenced ``HSET``; how many fields were new. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.hset(key, mapping)
        return int(self._apply(checked, commands)[0])

    def incrby(self, token: FencingToken | str, key: str, amount: int) -> int:
        """Fenced ``INCRBY``; the new value. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.incrby(key, amount)
        return int(self._apply(checked, commands)[0])

    def xadd(
        self, token: FencingToken | str, key: str, fields: Mapping[str, bytes | str], *, maxlen: int | None = None
    ) -> str:
        """Fenced ``XADD key [MAXLEN ~ maxlen] * ...``; the entry's id. Raises as `batch`."""
        checked, commands = self._single(token)
        commands.xadd(key, fields, maxlen=maxlen)
        return str(self._apply(checked, commands)[0])

    def high_water(self, scope: str) -> int:
        """``scope``'s mark: its own or its slot's default floor, the greater (0 if neither)."""
        scope = validate_scope(scope)
        try:
            own, floor = self.client.mget([script.hwm_key(scope), script.floor_key(scope)])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return max(int(own or 0), int(floor or 0))

    def high_waters(self) -> dict[str, int]:
        """Every scope that has a mark of its own, with its mark (a bounded SCAN).

        Raises:
            LimitExceeded: more than `SCAN_SCOPES_MAX` scopes.
        """
        scopes: list[str] = []
        try:
            for key in self.client.scan_iter(match=f"{script.HWM_PREFIX}*", count=1000):
                scope = scope_of_mark_key(key)
                if scope is not None:
                    scopes.append(scope)
                    if len(scopes) > SCAN_SCOPES_MAX:
                        raise LimitExceeded("SCAN_SCOPES_MAX", SCAN_SCOPES_MAX, "too many scopes to list")
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return {scope: self.high_water(scope) for scope in sorted(set(scopes))}

    def raise_high_waters(
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
        self._check_policy()  # a raised mark evicted would be a floor lost
        try:
            if not self._cluster:
                return self.marks_after(named, self._raise(keys=keys, args=args) if keys else [])
            # One call per key (each stays in its slot), pipelined: redis-py routes each by its key.
            sha = self.client.script_load(script.RAISE_MARKS)
            pipe = self.client.pipeline()
            for key, floor in zip(keys, args, strict=True):
                pipe.execute_command("EVALSHA", sha, 1, key, floor)
            return self.marks_after(named, [marks[0] for marks in pipe.execute()])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error

    # -- the I/O of a batch ----------------------------------------------------------------------

    def _check_policy(self) -> None:
        now_ns = time.monotonic_ns()
        if self.policy_due(now_ns):
            try:
                self.judge_policy(_infos(self._info_call()), now_ns)
            except redis_py.RedisError as error:
                raise _policy_unread(error, self.resource) from error

    def _apply(self, token: FencingToken, commands: Commands) -> list[Any]:
        if commands.scope is None:
            return []  # no key, no scope: nothing to fence
        self._check_policy()
        if not self.premise(token, commands.scope):
            self.admit(token, commands.scope, self.high_water(commands.scope))
        if self._cluster and not self._memory_seen:
            try:
                if self.memory == "v":
                    self.client.set(script.VERIFIED_KEY, "1")
                elif self.memory == "u" and self.client.exists(script.VERIFIED_KEY):
                    refuse_unsigned_after_signed(self.resource, True, UNSIGNED)
            except redis_py.RedisError as error:
                raise _translate(error, self.resource) from error
            self._memory_seen = True
        keys, args = commands.script_call(token, self._compare, self.memory, self._cluster)
        try:
            reply = self._write(keys=keys, args=args)
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge(token, commands, reply)

    def _checked_read(self, token: FencingToken, commands: Commands, key: str) -> bytes | None:
        assert commands.scope is not None
        if not self.premise(token, commands.scope):
            self.admit(token, commands.scope, self.high_water(commands.scope))
        try:
            reply = self._read(keys=[script.hwm_key(commands.scope), script.floor_key(commands.scope), key])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge_read(token, commands.scope, key, reply)


class AsyncRedisBatch(_Batch):
    """A fenced batch of `AsyncRedisFence` (see `RedisFence.batch`)."""

    def __init__(self, fence: AsyncRedisFence, token: FencingToken, scope: str | None) -> None:
        super().__init__(token, scope, fence.value_bytes_max)
        self._fence = fence

    async def get(self, key: str) -> bytes | None:
        """As `RedisBatch.get`."""
        known, value = self._buffered(key)
        if known:
            return value
        return await self._fence._checked_read(self.token, self._commands, key)


class AsyncRedisFence(_FenceBase):
    """`RedisFence` over ``redis.asyncio.Redis`` (or ``RedisCluster``): the same methods, awaited."""

    def __init__(
        self, client: Any, *, keys: object = None, cluster_id: str | None = None, value_bytes_max: int = VALUE_BYTES_MAX
    ) -> None:
        super().__init__(client, keys=keys, cluster_id=cluster_id, value_bytes_max=value_bytes_max)
        from redis.asyncio.cluster import RedisCluster as AsyncCluster

        self._cluster = isinstance(client, AsyncCluster)

    @classmethod
    def from_url(
        cls, url: str, *, keys: object, cluster_id: str | None = None, value_bytes_max: int = VALUE_BYTES_MAX,
        **options: Any,
    ) -> AsyncRedisFence:
        """As `RedisFence.from_url`, over ``redis.asyncio``."""
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
        """As `RedisFence.batch`: ``async with fence.batch(token) as b:``."""
        checked, scope = self._open(token, scope)
        unit = AsyncRedisBatch(self, checked, scope)
        yield unit
        unit.results = await self._apply(checked, unit._commands)

    async def set(self, token: FencingToken | str, key: str, value: bytes | str, *, px_ms: int | None = None) -> bool:
        checked, commands = self._single(token)
        commands.set(key, value, px_ms=px_ms)
        return bool((await self._apply(checked, commands))[0])

    async def delete(self, token: FencingToken | str, *keys: str) -> int:
        checked, commands = self._single(token)
        for key in keys:
            commands.delete(key)
        return sum(await self._apply(checked, commands))

    async def hset(self, token: FencingToken | str, key: str, mapping: Mapping[str, bytes | str]) -> int:
        checked, commands = self._single(token)
        commands.hset(key, mapping)
        return int((await self._apply(checked, commands))[0])

    async def incrby(self, token: FencingToken | str, key: str, amount: int) -> int:
        checked, commands = self._single(token)
        commands.incrby(key, amount)
        return int((await self._apply(checked, commands))[0])

    async def xadd(
        self, token: FencingToken | str, key: str, fields: Mapping[str, bytes | str], *, maxlen: int | None = None
    ) -> str:
        checked, commands = self._single(token)
        commands.xadd(key, fields, maxlen=maxlen)
        return str((await self._apply(checked, commands))[0])

    async def high_water(self, scope: str) -> int:
        scope = validate_scope(scope)
        try:
            own, floor = await self.client.mget([script.hwm_key(scope), script.floor_key(scope)])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return max(int(own or 0), int(floor or 0))

    async def high_waters(self) -> dict[str, int]:
        scopes: list[str] = []
        try:
            async for key in self.client.scan_iter(match=f"{script.HWM_PREFIX}*", count=1000):
                scope = scope_of_mark_key(key)
                if scope is not None:
                    scopes.append(scope)
                    if len(scopes) > SCAN_SCOPES_MAX:
                        raise LimitExceeded("SCAN_SCOPES_MAX", SCAN_SCOPES_MAX, "too many scopes to list")
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return {scope: await self.high_water(scope) for scope in sorted(set(scopes))}

    async def raise_high_waters(
        self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0
    ) -> dict[str, int]:
        keys, args, named, _ = self.floors_call(floors, default, every_slot=True)
        await self._check_policy()
        try:
            if not self._cluster:
                return self.marks_after(named, await self._raise(keys=keys, args=args) if keys else [])
            sha = await self.client.script_load(script.RAISE_MARKS)
            pipe = self.client.pipeline()
            for key, floor in zip(keys, args, strict=True):
                pipe.execute_command("EVALSHA", sha, 1, key, floor)
            return self.marks_after(named, [marks[0] for marks in await pipe.execute()])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error

    async def _check_policy(self) -> None:
        now_ns = time.monotonic_ns()
        if self.policy_due(now_ns):
            try:
                self.judge_policy(_infos(await self._info_call()), now_ns)
            except redis_py.RedisError as error:
                raise _policy_unread(error, self.resource) from error

    async def _apply(self, token: FencingToken, commands: Commands) -> list[Any]:
        if commands.scope is None:
            return []
        await self._check_policy()
        if not self.premise(token, commands.scope):
            self.admit(token, commands.scope, await self.high_water(commands.scope))
        if self._cluster and not self._memory_seen:  # as RedisFence._apply
            try:
                if self.memory == "v":
                    await self.client.set(script.VERIFIED_KEY, "1")
                elif self.memory == "u" and await self.client.exists(script.VERIFIED_KEY):
                    refuse_unsigned_after_signed(self.resource, True, UNSIGNED)
            except redis_py.RedisError as error:
                raise _translate(error, self.resource) from error
            self._memory_seen = True
        keys, args = commands.script_call(token, self._compare, self.memory, self._cluster)
        try:
            reply = await self._write(keys=keys, args=args)
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge(token, commands, reply)

    async def _checked_read(self, token: FencingToken, commands: Commands, key: str) -> bytes | None:
        assert commands.scope is not None
        if not self.premise(token, commands.scope):
            self.admit(token, commands.scope, await self.high_water(commands.scope))
        try:
            reply = await self._read(keys=[script.hwm_key(commands.scope), script.floor_key(commands.scope), key])
        except redis_py.RedisError as error:
            raise _translate(error, self.resource) from error
        return self.judge_read(token, commands.scope, key, reply)


def open_floor_target(url: str, *, cluster_id: str) -> RedisFence:
    """The Redis at ``url`` as ``stockade floor`` raises it (`stockade.resources.floor`).

    Raising floors writes no user data and carries no token, so no keys are
    needed: the fence it returns is only for `RedisFence.high_waters`,
    `RedisFence.raise_high_waters` and `RedisFence.close`.
    """
    return RedisFence.from_url(url, keys=TOKENLESS, cluster_id=cluster_id)
