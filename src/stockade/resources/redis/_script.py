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
- ``stockade:verified`` (on Redis Cluster ``stockade:verified:{TAG}``, one per
  slot, TAG as the floor's): L2's memory. A fenced write of a handle with keys
  sets it, in the script that raises the mark; the script refuses a write of an
  unsigned handle where it is set (`verified_key`, `MEMORY_MODES`).

Token values go up to 2**63-1, past the 2**53 that a Lua number holds
exactly, so the script compares marks as decimal strings (`LESS`), never as
numbers.
"""

from __future__ import annotations

import binascii
import functools

__all__ = [
    "FENCED_WRITE", "FENCED_SET", "RAISE_MARKS", "READ_CHECKED", "SLOTS", "hwm_key", "floor_key", "slot_of",
    "slot_tag", "key_tag", "COMPARE_MODES", "mark_keys", "set_keys", "verified_key", "VERIFIED_KEY", "MEMORY_MODES",
]

SLOTS = 16384  # Redis Cluster's hash slots
HWM_PREFIX = "stockade:hwm:"
FLOOR_PREFIX = "stockade:floor:"

#: The script's comparison. "ge" is the rule (R1: stale iff token < mark); the others exist
#: only for the controls (`stockade.testing.mutants`): ">" for ">=", and no check at all.
COMPARE_MODES = ("ge", "gt", "off")

VERIFIED_KEY = "stockade:verified"
#: The script's part in L2: "v" a handle with keys (sets the memory), "u" an unsigned handle (refused
#: where it is set), "-" neither (a tokenless handle, which admits nothing; the test control).
MEMORY_MODES = ("v", "u", "-")

# `a < b` for decimal strings without leading zeros (token values and marks).
_LESS = """
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
"""

# Redis's own refusals, predicted (Redis 7.0, src/util.c string2ll, src/t_string.c incrDecrCommand,
# src/t_stream.c xaddCommand). A 64-bit integer is held exactly as two Lua numbers, value = hi * 1e9 + lo
# with 0 <= lo < 1e9 (a Lua number is exact only to 2**53). Defined inside the INCRBY branch of
# `FENCED_WRITE`, where alone they are used: a script's top-level functions are made again on every call,
# and these three cost a fenced SET about a fifth of Redis's time in the script (24 against 30 us a call,
# INFO commandstats, 7 rounds of 5,000 calls, the host loaded).
_E9 = """
local E9 = 1000000000
"""
_INT64 = """
local MIN_HI, MIN_LO, MAX_HI, MAX_LO = -9223372037, 145224192, 9223372036, 854775807
local function norm(hi, lo)
  local carry = math.floor(lo / E9)
  return hi + carry, lo - carry * E9
end
local function in_range(hi, lo)
  return (hi > MIN_HI or (hi == MIN_HI and lo >= MIN_LO)) and (hi < MAX_HI or (hi == MAX_HI and lo <= MAX_LO))
end
-- string2ll: '0', or an optional '-', a digit 1-9, digits; at most 20 bytes; within int64. Else nil.
local function int64(s)
  if s == '0' then return 0, 0 end
  if #s > 20 or not string.find(s, '^%-?[1-9][0-9]*$') then return nil end
  local neg = string.byte(s, 1) == 45
  local digits = neg and string.sub(s, 2) or s
  if #digits > 19 then return nil end
  local hi, lo = tonumber(string.sub(digits, 1, -10)) or 0, tonumber(string.sub(digits, -9))
  if neg then hi, lo = norm(-hi, -lo) end
  if not in_range(hi, lo) then return nil end
  return hi, lo
end
"""

#: KEYS[1] the scope's mark, KEYS[2] its slot's floor, KEYS[3] the memory of verifying
#: (`verified_key`), KEYS[4..] the user's keys. ARGV[1] the token value, ARGV[2] the
#: comparison (`COMPARE_MODES`), ARGV[3] the handle's mode (`MEMORY_MODES`), then the
#: commands: name, index of its key in KEYS, count of arguments, the arguments.
#: Returns {0, mark} for a stale token, {2, mark} for an unsigned handle on a Redis that
#: verified (L2; nothing written either way), else {1, mark, result...}.
#:
#: Redis does not undo a script that fails halfway, so a first pass runs every
#: command on a model of the keys it touches, before the first write, and refuses
#: the batch (a ``FENCEBATCH`` error, nothing written) wherever Redis would refuse
#: a command: the wrong type for HSET, INCRBY and XADD; INCRBY on a value that
#: Redis's string2ll does not read as a 64-bit integer, or whose sum leaves the
#: signed 64-bit range, counting the earlier commands of the batch exactly; XADD
#: on a stream whose last id is the greatest there is. What else could fail is
#: ruled out before the script (`stockade.resources.redis._batch.Commands`):
#: SET's PX is bounded, an XADD's id is ``*`` and its entry below Redis's 1 GiB,
#: and Redis refuses a script for OOM, READONLY or NOREPLICAS only at its first
#: write. The mark is written with the commands, in the same script, so both or
#: neither are applied. Should a command fail all the same, the script stops
#: there and says ``FENCEPARTIAL`` (a bug in this model, never an unknown outcome).
FENCED_WRITE = _LESS + _E9 + """
local token, compare, memory = ARGV[1], ARGV[2], ARGV[3]
local marks = redis.call('MGET', KEYS[1], KEYS[2])
local own, floor = marks[1] or '0', marks[2] or '0'
local mark = own
if less(mark, floor) then mark = floor end
if (compare == 'ge' and less(token, mark)) or (compare == 'gt' and not less(mark, token)) then
  return {0, mark}
end
local verified = redis.call('EXISTS', KEYS[3]) == 1
if memory == 'u' and verified then return {2, mark} end
local i = 4
-- The first pass. A batch of one SET or one DEL, the common case, skips it: neither can be refused,
-- and what the pass notes of them only later commands of the batch would read.
if not (#ARGV >= 6 and #ARGV == 6 + tonumber(ARGV[6]) and (ARGV[4] == 'SET' or ARGV[4] == 'DEL')) then
-- each key as the batch leaves it: its type; a string's value (its bytes, or {hi, lo} once counted);
-- a stream's room (how many more ids XADD can make: math.huge unless its last id's ms is 2**64-1)
local kinds, values, room = {}, {}, {}
local function kind(key)
  local k = kinds[key]
  if k == nil then k = redis.call('TYPE', key)['ok']; kinds[key] = k end
  return k
end
local function refuse(why) return redis.error_reply('FENCEBATCH ' .. why) end
while i <= #ARGV do
  local name, key, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if name == 'SET' then
    kinds[key], values[key], room[key] = 'string', ARGV[i + 3], nil
  elseif name == 'DEL' then
    kinds[key], values[key], room[key] = 'none', nil, nil
  elseif name == 'HSET' then
    local k = kind(key)
    if k ~= 'none' and k ~= 'hash' then return refuse('WRONGTYPE HSET on a ' .. k .. ' key') end
    kinds[key] = 'hash'
  elseif name == 'INCRBY' then""" + _INT64 + """
    local k = kind(key)
    if k ~= 'none' and k ~= 'string' then return refuse('WRONGTYPE INCRBY on a ' .. k .. ' key') end
    local v = values[key]
    if k == 'none' then v = {0, 0} elseif v == nil then v = redis.call('GET', key) end
    if type(v) == 'string' then
      local hi, lo = int64(v)
      if hi == nil then return refuse('INCRBY on a value that is not an integer or out of range') end
      v = {hi, lo}
    end
    local by_hi, by_lo = int64(ARGV[i + 3])
    local hi, lo = norm(v[1] + by_hi, v[2] + by_lo)
    if not in_range(hi, lo) then return refuse('INCRBY: increment or decrement would overflow') end
    kinds[key], values[key] = 'string', {hi, lo}
  elseif name == 'XADD' then
    local k = kind(key)
    if k ~= 'none' and k ~= 'stream' then return refuse('WRONGTYPE XADD on a ' .. k .. ' key') end
    if k == 'none' then room[key] = math.huge end
    if room[key] == nil then
      local info, last = redis.call('XINFO', 'STREAM', key), nil
      for j = 1, #info, 2 do if info[j] == 'last-generated-id' then last = info[j + 1] end end
      local ms, seq = string.match(last, '^(%d+)%-(%d+)$')
      room[key] = math.huge
      if ms == '18446744073709551615' then
        local hi, lo = tonumber(string.sub(seq, 1, -10)) or 0, tonumber(string.sub(seq, -9))
        room[key] = (18446744073 - hi) * E9 + (709551615 - lo)
      end
    end
    if room[key] < 1 then return refuse('XADD: the stream has exhausted the last possible ID') end
    kinds[key], room[key] = 'stream', room[key] - 1
  else
    return refuse('command not allowed in a fenced batch: ' .. name)
  end
  i = i + 3 + n
end
end
local out = {1, mark}
if less(own, token) then redis.call('SET', KEYS[1], token); out[2] = token end
if less(out[2], mark) then out[2] = mark end
if memory == 'v' and not verified then redis.call('SET', KEYS[3], '1') end
i = 4
while i <= #ARGV do
  local name, key, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  local args = {}
  for j = 1, n do args[j] = ARGV[i + 2 + j] end
  local result = redis.pcall(name, key, unpack(args))
  if type(result) == 'table' and result['err'] then
    return redis.error_reply('FENCEPARTIAL after ' .. (#out - 2) .. ' commands: ' .. result['err'])
  end
  if name == 'SET' then
    out[#out + 1] = 1
  elseif name == 'INCRBY' then
    out[#out + 1] = redis.call('GET', key)  -- as a string: exact past 2**53
  else
    out[#out + 1] = result
  end
  i = i + 3 + n
end
return out
"""

#: One fenced SET, the common write: `FENCED_WRITE`'s rule for a batch of that one SET, without the
#: parsing of a batch or its first pass (a SET with a checked PX cannot be refused). KEYS[1..3] as
#: `FENCED_WRITE`'s, KEYS[4] the user's key; ARGV[1] the token value, ARGV[2] the comparison and the
#: handle's mode in one (``"gev"``: "ge" then "v"), ARGV[3] the value, ARGV[4] the PX in ms (absent: none).
#: Returns 1 once written,
#: or {0, mark} / {2, mark} as `FENCED_WRITE` (nothing written). The mark, the floor and the memory are
#: read by one MGET (the memory by EXISTS too when MGET finds no string: EXISTS is what it means); the
#: user's SET goes first, so Redis's refusal for OOM, which comes at a script's first write, leaves
#: nothing written; the comparisons are `_LESS`'s, inline (no function made on every call).
FENCED_SET = """
local token = ARGV[1]
local got = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
local own, mark = got[1] or '0', got[2] or '0'
if #mark < #own or (#mark == #own and mark < own) then mark = own end
local compare, memory = string.sub(ARGV[2], 1, 2), string.sub(ARGV[2], -1)
if compare == 'ge' then
  if #token < #mark or (#token == #mark and token < mark) then return {0, mark} end
elseif compare == 'gt' then
  if #token < #mark or (#token == #mark and token <= mark) then return {0, mark} end
end
local verified = got[3] or redis.call('EXISTS', KEYS[3]) == 1
if memory == 'u' and verified then return {2, mark} end
if ARGV[4] then redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[4]) else redis.call('SET', KEYS[4], ARGV[3]) end
if #own < #token or (#own == #token and own < token) then redis.call('SET', KEYS[1], token) end
if memory == 'v' and not verified then redis.call('SET', KEYS[3], '1') end
return 1
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


@functools.lru_cache(maxsize=4096)
def set_keys(scope: str, cluster: bool) -> tuple[bytes, bytes, bytes]:
    """`FENCED_SET`'s first three keys for ``scope`` as bytes (mark, floor, memory), kept for the scopes in use."""
    hwm, floor = mark_keys(scope)
    return hwm.encode(), floor.encode(), verified_key(scope, cluster).encode()


def verified_key(scope: str, cluster: bool) -> str:
    """The key of L2's memory that ``scope``'s script reads: the one key on one server, its slot's on a cluster."""
    return f"{VERIFIED_KEY}:{{{slot_tag(slot_of(scope))}}}" if cluster else VERIFIED_KEY


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
