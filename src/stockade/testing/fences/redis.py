"""The fence harnesses over a real redis-server: ``redis`` (redis-py sync) and ``redis-async`` (asyncio).

A unit is a fenced batch: ``unit.write(key, value)`` buffers ``SET {scope}:key``,
``unit.read(key)`` is the batch's checked read (its own buffered writes, else
Redis), and the end of the block applies the batch in one script call.

The controls are built with the adapter's private seams: ``fencing-off`` and
``strict-greater`` swap the Python rule (`FenceCore.fence_rule`) and the
script's comparison (``_compare``) together; ``check-then-write`` judges the
mark read with GET when the unit opens, calls ``between_check_and_write``,
reads plainly, and applies the batch at the end with the script's check off.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import redis

from stockade.core.fence import Reject, decide
from stockade.keys import FixedKeys
from stockade.resources._inputs import coerce_token
from stockade.resources.redis import AsyncRedisFence, RedisFence
from stockade.resources.redis import _script as script_module
from stockade.testing.mutants import accept_everything, reject_equal
from stockade.testing.servers.redis import RedisServer, require_redis

T = TypeVar("T")
VALUE_BYTES_MAX = 4096


def data_key(scope: str, key: str) -> str:
    return f"{{{scope}}}:{key}"


def dress(fence: Any, mutant: str | None) -> Any:
    """Turn ``fence`` into the control ``mutant`` (None: leave it right)."""
    if mutant == "fencing-off":
        fence.fence_rule, fence._compare = accept_everything, "off"
    elif mutant == "strict-greater":
        fence.fence_rule, fence._compare = reject_equal, "gt"
    elif mutant == "check-then-write":
        fence._compare = "off"  # the harness checks in Python when the unit opens
    else:
        assert mutant is None, mutant
    return fence


def redis_state(client: redis.Redis) -> Any:
    """Every key with its serialized value (marks, floors and the user's data)."""
    keys = sorted(client.scan_iter(count=1000))
    pipe = client.pipeline(transaction=True)
    for key in keys:
        pipe.dump(key)
    return tuple(zip(keys, pipe.execute(), strict=True))


class _Unit:
    def __init__(self, harness: Any, batch: Any, scope: str) -> None:
        self._harness, self._batch, self._scope = harness, batch, scope

    def write(self, key: str, value: bytes) -> None:
        self._batch.set(data_key(self._scope, key), value)

    def read(self, key: str) -> bytes | None:
        full = data_key(self._scope, key)
        if self._harness.mutant == "check-then-write":  # trusts its earlier check: a plain read
            known, value = self._batch._buffered(full)
            return value if known else self._harness.read(self._scope, key)
        return self._harness._get(self._batch, full)


class _HarnessBase:
    value_bytes_max = VALUE_BYTES_MAX
    fence: Any  # the sync or the async fence (each subclass opens its own)
    high_water: Callable[[str], int]

    def __init__(self, server: RedisServer, mutant: str | None, owner: bool) -> None:
        self.server, self.mutant, self._owner = server, mutant, owner
        self.between_check_and_write: Callable[[], None] | None = None
        self.plain = redis.Redis.from_url(server.url)

    def read(self, scope: str, key: str) -> bytes | None:
        return self.plain.get(data_key(scope, key))  # type: ignore[return-value]

    def state(self) -> Any:
        return redis_state(self.plain)

    def _check_then(self, token: Any, scope: str) -> Any:
        """The check-then-write control's check: GET the mark, judge it in Python, then pause."""
        checked = coerce_token(token)
        mark = self.high_water(scope)
        decision = decide(checked, cluster=self.fence.cluster_id, scope=scope, high_water=mark)
        if isinstance(decision, Reject):
            self.fence.refuse(checked, scope, decision)
        if self.between_check_and_write is not None:
            self.between_check_and_write()
        return checked

    def _close_plain(self) -> None:
        self.plain.close()
        if self._owner:
            self.server.stop()


class SyncRedisHarness(_HarnessBase):
    def __init__(self, server: RedisServer, cluster_id: str, keys: FixedKeys, mutant: str | None,
                 owner: bool = True) -> None:
        super().__init__(server, mutant, owner)
        self._args = (cluster_id, keys)
        self.fence = dress(RedisFence.from_url(server.url, keys=keys, cluster_id=cluster_id,
                                               value_bytes_max=VALUE_BYTES_MAX), mutant)

    @contextmanager
    def fenced(self, scope: str, token: Any) -> Iterator[_Unit]:
        if self.mutant == "check-then-write":
            token = self._check_then(token, scope)
        with self.fence.batch(token, scope=scope) as batch:
            yield _Unit(self, batch, scope)

    def _get(self, batch: Any, key: str) -> bytes | None:
        return batch.get(key)

    def high_water(self, scope: str) -> int:
        return self.fence.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self.fence.raise_high_waters(floors, default=default)

    def clone(self) -> SyncRedisHarness:
        return SyncRedisHarness(self.server, *self._args, self.mutant, owner=False)

    def close(self) -> None:
        self.fence.close()
        self._close_plain()


class _Loop:
    """A private event loop on its own thread: the async client lives there, the suite's threads call in."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class AsyncRedisHarness(_HarnessBase):
    def __init__(self, server: RedisServer, cluster_id: str, keys: FixedKeys, mutant: str | None,
                 loop: _Loop | None = None) -> None:
        super().__init__(server, mutant, loop is None)
        self._args = (cluster_id, keys)
        self._loop = loop or _Loop()

        async def make() -> AsyncRedisFence:
            return AsyncRedisFence.from_url(server.url, keys=keys, cluster_id=cluster_id,
                                            value_bytes_max=VALUE_BYTES_MAX)

        self.fence = dress(self._loop.run(make()), mutant)

    @contextmanager
    def fenced(self, scope: str, token: Any) -> Iterator[_Unit]:
        if self.mutant == "check-then-write":
            token = self._check_then(token, scope)
        context = self.fence.batch(token, scope=scope)
        batch = self._loop.run(context.__aenter__())
        try:
            yield _Unit(self, batch, scope)
        except BaseException as error:
            self._loop.run(context.__aexit__(type(error), error, error.__traceback__))
            raise
        self._loop.run(context.__aexit__(None, None, None))

    def _get(self, batch: Any, key: str) -> bytes | None:
        return self._loop.run(batch.get(key))

    def high_water(self, scope: str) -> int:
        return self._loop.run(self.fence.high_water(scope))

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self._loop.run(self.fence.raise_high_waters(floors, default=default))

    def clone(self) -> AsyncRedisHarness:
        return AsyncRedisHarness(self.server, *self._args, self.mutant, self._loop)

    def close(self) -> None:
        self._loop.run(self.fence.close())
        if self._owner:
            self._loop.close()
        self._close_plain()


def make_redis_harness(tmp_path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> SyncRedisHarness:
    require_redis()
    return SyncRedisHarness(RedisServer(tmp_path), cluster_id, keys, mutant)


def make_async_redis_harness(
    tmp_path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None
) -> AsyncRedisHarness:
    require_redis()
    return AsyncRedisHarness(RedisServer(tmp_path), cluster_id, keys, mutant)


# -- the control of the batch's first pass -----------------------------------------------------------

def old_first_pass(fence: Any) -> Any:
    """Turn ``fence`` into the control ``old-first-pass``: its script is the one before issue 26.

    That first pass read any ``-?digits`` of at most 18 characters as an
    integer (Redis refuses ``01``, ``-0``, ``007``) and forgot what the batch's
    earlier INCRBYs added, so Redis could refuse a command after the mark and
    the earlier commands were written: the batch half-applied, reported as
    `BackendUnavailable` (outcome unknown). Returns ``fence``.
    """
    fence._write = fence.client.register_script(OLD_FENCED_WRITE)
    return fence


OLD_FENCED_WRITE = script_module._LESS + """
local token, compare = ARGV[1], ARGV[2]
local marks = redis.call('MGET', KEYS[1], KEYS[2])
local own, floor = marks[1] or '0', marks[2] or '0'
local mark = own
if less(mark, floor) then mark = floor end
if (compare == 'ge' and less(token, mark)) or (compare == 'gt' and not less(mark, token)) then
  return {0, mark}
end
local kinds, values = {}, {}  -- each key's type (and a SET's value) as the batch leaves it
local function kind(key)
  local k = kinds[key]
  if k == nil then k = redis.call('TYPE', key)['ok']; kinds[key] = k end
  return k
end
local integer = '^-?%d+$'
local i = 4  -- KEYS[3], ARGV[3]: L2's memory, which this old script ignores
while i <= #ARGV do
  local name, key, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if name == 'SET' then
    kinds[key], values[key] = 'string', ARGV[i + 3]
  elseif name == 'DEL' then
    kinds[key], values[key] = 'none', nil
  elseif name == 'HSET' then
    local k = kind(key)
    if k ~= 'none' and k ~= 'hash' then
      return redis.error_reply('FENCEBATCH WRONGTYPE HSET on a ' .. k .. ' key')
    end
    kinds[key] = 'hash'
  elseif name == 'INCRBY' then
    local k = kind(key)
    if k ~= 'none' and k ~= 'string' then
      return redis.error_reply('FENCEBATCH WRONGTYPE INCRBY on a ' .. k .. ' key')
    end
    if k == 'string' then
      local v = values[key] or redis.call('GET', key)
      if not string.match(v, integer) or #v > 18 then
        return redis.error_reply('FENCEBATCH INCRBY on a value that is not a small integer')
      end
    end
    kinds[key], values[key] = 'string', '0'
  elseif name == 'XADD' then
    local k = kind(key)
    if k ~= 'none' and k ~= 'stream' then
      return redis.error_reply('FENCEBATCH WRONGTYPE XADD on a ' .. k .. ' key')
    end
    kinds[key] = 'stream'
  else
    return redis.error_reply('FENCEBATCH command not allowed in a fenced batch: ' .. name)
  end
  i = i + 3 + n
end
local out = {1, mark}
if less(own, token) then redis.call('SET', KEYS[1], token); out[2] = token end
if less(out[2], mark) then out[2] = mark end
i = 4
while i <= #ARGV do
  local name, key, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  local args = {}
  for j = 1, n do args[j] = ARGV[i + 2 + j] end
  if name == 'SET' then
    redis.call('SET', key, unpack(args))
    out[#out + 1] = 1
  elseif name == 'INCRBY' then
    redis.call('INCRBY', key, args[1])
    out[#out + 1] = redis.call('GET', key)  -- as a string: exact past 2**53
  else
    out[#out + 1] = redis.call(name, key, unpack(args))
  end
  i = i + 3 + n
end
return out
"""
