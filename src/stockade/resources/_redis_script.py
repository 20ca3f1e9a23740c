"""What runs inside Redis for `stockade.resources.redis`: the Lua text, and where its keys live.

Key layout (docs/fence-redis.md):

- ``stockade:hwm:{SCOPE}``: the scope's own high-water mark, a decimal string.
  Its hash tag is the scope, so it lives in the slot of the scope's data keys
  (which must carry ``{SCOPE}``): one script can read the mark and write the
  data on Redis Cluster.
- ``stockade:floor:{TAG}``: the default floor (R4) of every scope in one hash
  slot. TAG is a short string chosen so that the key lands in that slot
  (`slot_tag`); there is one such key per slot (16384), written only by
  ``raise_high_waters(..., default=N)``. A scope's mark is
  ``max(own, floor of its slot)``, so a floor covers scopes the resource has
  never seen, and the fenced script reads it in the scope's own slot.

Token values go up to 2**63-1, past the 2**53 that a Lua number holds
exactly, so the script compares marks as decimal strings (`LESS`), never as
numbers.
"""

from __future__ import annotations

import binascii
import functools

__all__ = [
    "FENCED_WRITE", "RAISE_MARKS", "READ_CHECKED", "SLOTS", "hwm_key", "floor_key", "slot_of", "slot_tag",
    "key_tag", "COMPARE_MODES", "mark_keys",
]

SLOTS = 16384  # Redis Cluster's hash slots
HWM_PREFIX = "stockade:hwm:"
FLOOR_PREFIX = "stockade:floor:"

#: The script's comparison. "ge" is the rule (R1: stale iff token < mark); the others exist
#: only for the controls (`stockade.testing.mutants`): ">" for ">=", and no check at all.
COMPARE_MODES = ("ge", "gt", "off")

# `a < b` for decimal strings without leading zeros (token values and marks).
_LESS = """
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
"""

#: KEYS[1] the scope's mark, KEYS[2] its slot's floor, KEYS[3..] the user's keys.
#: ARGV[1] the token value, ARGV[2] the comparison (`COMPARE_MODES`), then the
#: commands: name, index of its key in KEYS, count of arguments, the arguments.
#: Returns {0, mark} for a stale token (nothing written), else {1, mark, result...}.
#:
#: Redis does not undo a script that fails halfway, so a first pass checks that
#: no command can fail (each key's type, as the earlier commands of the batch
#: leave it; INCRBY on an integer) before the first write; the mark is written
#: with the commands, in the same script, so both or neither are applied.
FENCED_WRITE = _LESS + """
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
local i = 3
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
i = 3
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

#: KEYS[i] a mark (a scope's own or a slot's floor), ARGV[i] its floor: each is
#: raised to at least its floor, never lowered; returns every mark after.
RAISE_MARKS = _LESS + """
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key) or '0'
  if less(v, ARGV[i]) then redis.call('SET', key, ARGV[i]); v = ARGV[i] end
  out[i] = v
end
return out
"""

#: KEYS[1] the scope's mark, KEYS[2] its slot's floor, KEYS[3] a user's key:
#: {own mark, floor, the key's value} read at one instant (a batch's checked read).
READ_CHECKED = """
return {redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3])}
"""


def slot_of(tag: str) -> int:
    """The Redis Cluster hash slot of a hash tag (CRC16/XMODEM of its bytes, mod 16384)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % SLOTS


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    # The smallest decimal string landing in each slot: found once, ~0.2 s, then kept.
    tags: list[str | None] = [None] * SLOTS
    missing, n = SLOTS, 0
    while missing:
        slot = slot_of(str(n))
        if tags[slot] is None:
            tags[slot] = str(n)
            missing -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def slot_tag(slot: int) -> str:
    """A hash tag whose slot is ``slot``."""
    return _slot_tags()[slot]


@functools.lru_cache(maxsize=4096)
def mark_keys(scope: str) -> tuple[str, str]:
    """``(hwm_key(scope), floor_key(scope))``, kept for the scopes in use (a CRC per write saved)."""
    return hwm_key(scope), floor_key(scope)


def hwm_key(scope: str) -> str:
    """The key holding ``scope``'s own mark (hash tag: the scope)."""
    return f"{HWM_PREFIX}{{{scope}}}"


def floor_key(scope: str) -> str:
    """The key holding the default floor of ``scope``'s slot."""
    return f"{FLOOR_PREFIX}{{{slot_tag(slot_of(scope))}}}"


def key_tag(key: str) -> str | None:
    """The hash tag Redis Cluster hashes ``key`` by: the text inside its first ``{...}``, or None."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]
